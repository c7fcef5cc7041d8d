"""The cases behind ``dlo check dp_scratch <step>`` (Jour2/dp_scratch_train.py): one function per step, run at any
world size, in a process group of one (the checker's own process) or on several gloo processes
(``checks/dp_scratch_worker.py``). Outside the ``checks`` package so that the worker processes start without
importing every course's checkers.

Every all-reduce the student's code launches is seen through :func:`dlo.parallel.dp_events.record_collectives`;
the broadcasts of step 2 are recorded without communicating, compared across ranks, then replayed, so that a
broadcast called on some ranks only is reported instead of hanging the run.
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from dlo.parallel.dp_events import Timeline, record_collectives

TOL = 1e-6  # fp32 gradients: |got - expected| <= TOL + TOL * |expected|
STEPS = ("naive", "broadcast", "overlap", "buckets", "no_sync")
PER_RANK = 6  # samples per rank (3 micro-batches of 2 in the no_sync step)


class Bad(AssertionError):
    """A wrong answer, said in one line (raised by the cases, turned into CheckFailed by the checkers)."""


def _expect(cond: bool, message: str) -> None:
    if not cond:
        raise Bad(message)


def load_script(path: str | Path) -> dict[str, Any]:
    """The definitions of a course script, executed as a module named ``__exercises__`` (its main does not run),
    as :func:`dlo.course.checks.framework.load_exercises` does."""
    path = Path(path).resolve()
    ns: dict[str, Any] = {"__name__": "__exercises__", "__file__": str(path)}
    exec(compile(path.read_text(), str(path), "exec"), ns)  # noqa: S102 - course code
    return ns


# ----------------------------------------------------------------------------------------------------
# Models, data, references
# ----------------------------------------------------------------------------------------------------
def _mlp(seed: int = 0) -> nn.Module:
    """Nine parameter tensors of different sizes, one layer without bias, small first layers (so that a bucket
    plan has a last, partial bucket); no BatchNorm (so that one process on the global batch computes the same
    gradients)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 3), nn.Tanh(), nn.Linear(3, 7), nn.Tanh(), nn.Linear(7, 5, bias=False),
                         nn.Tanh(), nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3))


def _bn_net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 5), nn.BatchNorm1d(5), nn.ReLU(), nn.Linear(5, 3))


def _world() -> tuple[int, int]:
    return dist.get_rank(), dist.get_world_size()


def _global_batch(world: int, step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(50 + step)
    x = torch.randn(world * PER_RANK, 6, generator=gen)
    x = x * (1 + torch.arange(world).repeat_interleave(PER_RANK)[:, None])  # ranks' slices differ in scale
    return x, torch.randint(0, 3, (world * PER_RANK,), generator=gen)


def _local(batch, rank: int):
    x, y = batch
    return x[rank * PER_RANK:(rank + 1) * PER_RANK], y[rank * PER_RANK:(rank + 1) * PER_RANK]


def _grads(model: nn.Module) -> list[torch.Tensor | None]:
    return [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()]


def _reference_grads(steps: int = 1, set_to_none: tuple[bool, ...] = (True,)) -> dict[str, list[list[torch.Tensor]]]:
    """Per step: the gradients of DDP on this rank's slice, of one process on the global batch, and of this
    rank alone (its own slice, no communication), SGD(lr 0.1) in between."""
    rank, world = _world()
    out: dict[str, list] = {"ddp": [], "single": [], "local": []}
    ddp, single, local = DDP(_mlp()), _mlp(), _mlp()
    opts = {k: torch.optim.SGD(m.parameters(), lr=0.1) for k, m in (("ddp", ddp), ("single", single), ("local", local))}
    for step in range(steps):
        batch = _global_batch(world, step)
        for key, model, data in (("ddp", ddp, _local(batch, rank)), ("single", single, batch),
                                 ("local", local, _local(batch, rank))):
            opts[key].zero_grad(set_to_none=set_to_none[step % len(set_to_none)])
            F.cross_entropy(model(data[0]), data[1]).backward()
            out[key].append(_grads(model))
            opts[key].step()
    return out


def _far(got: list, want: list) -> float:
    """Largest error relative to TOL's rule (<= 1: equal); inf when a gradient is missing or misshapen."""
    worst = 0.0
    for g, w in zip(got, want):
        if g is None or g.shape != w.shape:
            return float("inf")
        worst = max(worst, float(((g - w).abs() / (TOL + TOL * w.abs())).max()))
    return worst


def _max_diff(got: list, want: list) -> float:
    return max(float((g - w).abs().max()) if g is not None else float("inf") for g, w in zip(got, want))


def _diagnose(got: list, ref: dict, step: int, what: str = "p.grad") -> dict:
    """Check gradients against DDP's and one process's; raise Bad naming the likely mistake."""
    rank, world = _world()
    ddp, single, local = ref["ddp"][step], ref["single"][step], ref["local"][step]
    missing = [i for i, g in enumerate(got) if g is None]
    _expect(not missing, f"{what} is None for parameter(s) {missing} after finishing: every parameter needs its "
                         "averaged gradient")
    diffs = {"ddp": _max_diff(got, ddp), "single": _max_diff(got, single)}
    if _far(got, ddp) <= 1 and _far(got, single) <= 1:
        return diffs
    if world > 1 and _far(got, [g * world for g in ddp]) <= 1:
        raise Bad(f"the gradients are {world} times (the world size) too large: all_reduce sums, divide the sum by "
                  "dist.get_world_size()")
    if world > 1 and _far(got, [g / world for g in ddp]) <= 1:
        raise Bad(f"the gradients are {world} times (the world size) too small: they were divided twice "
                  "(ReduceOp.AVG already averages; or the same gradients were divided again)")
    if world > 1 and _far(got, local) <= 1:
        raise Bad(f"{what} still holds this rank's own gradient: no average reached it (all-reduce the gradient "
                  "tensor itself, in place, not a copy, and copy results back where the optimizer reads them)")
    raise Bad(f"the gradients differ from DDP's by up to {diffs['ddp']:.2g} (allowed: {TOL:g} + {TOL:g} x |g|) "
              f"and from one process on the global batch by up to {diffs['single']:.2g}")


def _loss_backward(model: nn.Module, data, timeline: Timeline | None = None) -> None:
    loss = F.cross_entropy(model(data[0]), data[1])
    with (timeline.span("backward") if timeline is not None else contextlib.nullcontext()):
        loss.backward()


# ----------------------------------------------------------------------------------------------------
# The cases, one per step (any world size; a process group must exist)
# ----------------------------------------------------------------------------------------------------
def case_naive(ns: dict) -> dict:
    allreduce_gradients = ns["allreduce_gradients"]
    rank, world = _world()
    ref = _reference_grads()
    model = _mlp()
    _loss_backward(model, _local(_global_batch(world), rank))
    timeline = Timeline()
    with record_collectives(timeline):
        allreduce_gradients(model)
    calls = timeline.collectives()
    _expect(calls, "no torch.distributed.all_reduce call was seen: all-reduce every gradient (dist.all_reduce)")
    return _diagnose(_grads(model), ref, 0)


class _RecordedBroadcasts:
    """dist.broadcast replaced by a recorder that does not communicate (see the module docstring)."""

    def __init__(self) -> None:
        self.calls: list[tuple[torch.Tensor, Any, Any]] = []
        self.real = dist.broadcast

    def __call__(self, tensor, src=None, group=None, async_op=False, group_src=None):
        self.calls.append((tensor, src if src is not None else group_src, group))

        class Done:
            def wait(self, *a, **k):
                return True

            def is_completed(self):
                return True

        return Done() if async_op else None

    @contextlib.contextmanager
    def active(self):
        dist.broadcast = self
        try:
            yield self
        finally:
            dist.broadcast = self.real


def _rank_dependent(model: nn.Module, rank: int) -> nn.Module:
    """Buffers that differ per rank, as after a few training steps on different data."""
    with torch.no_grad():
        model[1].running_mean.add_(rank + 1.0)
        model[1].running_var.mul_(rank + 2.0)
        model[1].num_batches_tracked.fill_(rank + 3)
    return model


def case_broadcast(ns: dict) -> dict:
    broadcast_state = ns["broadcast_state"]
    rank, world = _world()
    model = _rank_dependent(_bn_net(seed=100 + rank), rank)
    reference = _rank_dependent(_bn_net(seed=100), 0)
    recorder = _RecordedBroadcasts()
    with recorder.active():
        broadcast_state(model)
    seen = {(t.data_ptr(), t.numel()) for t, _, _ in recorder.calls}
    srcs = sorted({int(s) if s is not None else -1 for _, s, _ in recorder.calls})
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, {"calls": len(recorder.calls), "srcs": srcs})
    counts = [e["calls"] for e in everyone]
    _expect(any(counts), "dist.broadcast was never called: broadcast every parameter and buffer from rank 0")
    _expect(len(set(counts)) == 1,
            f"the ranks called dist.broadcast {counts} times: every rank must call it, the same number of times "
            "(rank 0 sends, the others receive; a broadcast on rank 0 only waits forever)")
    sources = [e["srcs"] for e in everyone]
    if world > 1 and all(s == [r] for r, s in enumerate(sources)):
        raise Bad("each rank named itself as the source: src must be 0 on every rank (rank 0's copy is the reference)")
    _expect(all(s == [0] for s in sources), f"broadcast from rank 0 (src=0) on every rank, got sources {sources}")
    missing_p = [n for n, p in model.named_parameters() if (p.data_ptr(), p.numel()) not in seen]
    missing_b = [n for n, b in model.named_buffers() if (b.data_ptr(), b.numel()) not in seen]
    _expect(not missing_p, f"parameter(s) {missing_p} were not broadcast in place: broadcast each parameter tensor "
                           "itself (p or p.data), not a copy (a copy receives rank 0's values and is thrown away)")
    _expect(not missing_b, f"buffers {missing_b} were not broadcast: buffers (BatchNorm's running statistics) are "
                           "state too, and DDP broadcasts them (model.buffers())")
    for tensor, src, group in recorder.calls:  # now for real, in the order every rank called them
        recorder.real(tensor, src=src, group=group)
    for (name, got), want in zip(model.state_dict().items(), reference.state_dict().values()):
        _expect(torch.equal(got, want), f"after the broadcasts, {name} differs from rank 0's")
    return {}


def _check_async_collectives(timeline: Timeline, expected: int, unit: str, what: str) -> None:
    calls = timeline.collectives()
    during = [e for e in calls if e["during"] == "backward"]
    _expect(calls, f"no all-reduce was launched: register the hooks in __init__ and launch the all-reduces from "
                   f"{what}")
    _expect(during, "the all-reduces ran after backward, not during it: launch each one from the hook "
                    "(register_post_accumulate_grad_hook), while backward goes on")
    _expect(all(e["async_op"] for e in during),
            "pass async_op=True: a blocking all-reduce inside the hook stops backward until it completes (no overlap)")
    _expect(all(e["waited"] for e in calls),
            "finish() must call wait() on every handle before the optimizer step: an all-reduce still running has "
            "not averaged its gradient yet")
    _expect(len(during) == expected, f"{len(during)} all-reduces during backward for {expected} {unit}: one per "
                                     f"{unit.rstrip('s')}, launched once (hooks registered once, in __init__)")


def case_overlap(ns: dict) -> dict:
    cls = ns["OverlappedGradSync"]
    rank, world = _world()
    ref = _reference_grads(steps=2, set_to_none=(True, False))
    model = _mlp()
    n = len(list(model.parameters()))
    sync = cls(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    diffs = {}
    for step, set_to_none in ((0, True), (1, False)):
        timeline = Timeline()
        opt.zero_grad(set_to_none=set_to_none)
        with record_collectives(timeline):
            _loss_backward(model, _local(_global_batch(world, step), rank), timeline)
            sync.finish()
        _check_async_collectives(timeline, n, "parameters", "_on_grad_ready, the hook")
        _expect(not getattr(sync, "pending", None), "empty self.pending at the end of finish(): otherwise the next "
                                                    "finish() waits for and divides this step's gradients once more")
        diffs = _diagnose(_grads(model), ref, step)
        opt.step()
    return diffs


def _ref_plan(params, bucket_bytes: int, *, reverse: bool = True, size=lambda p: p.numel() * p.element_size(),
              strict: bool = False) -> list[list[int]]:
    order = reversed(range(len(params))) if reverse else range(len(params))
    buckets, current, total = [], [], 0
    for i in order:
        if strict and current and total + size(params[i]) > bucket_bytes:
            buckets.append(current)
            current, total = [], 0
        current.append(i)
        total += size(params[i])
        if not strict and total >= bucket_bytes:
            buckets.append(current)
            current, total = [], 0
    if current:
        buckets.append(current)
    return buckets


def _check_plan(plan_buckets: Callable) -> None:
    params = [torch.empty(n) for n in (10, 3, 7, 20, 5, 8, 2)]
    for cap in (40, 48, 1, 10**9):
        want = _ref_plan(params, cap)
        got = plan_buckets(params, cap)
        got = [[int(i) for i in b] for b in got] if got is not None else None
        if got == want:
            continue
        if got == _ref_plan(params, cap, reverse=False):
            raise Bad("fill the buckets in reverse registration order: the last parameters' gradients are ready first")
        if got == _ref_plan(params, cap, size=lambda p: p.numel()):
            raise Bad("bucket_bytes is in bytes: count numel() * element_size() per gradient, not numel()")
        if got == want[:-1]:
            raise Bad("the last, partial bucket is missing: keep what remains after the loop as a bucket")
        if got == _ref_plan(params, cap, strict=True):
            raise Bad("a bucket closes once its gradients add up to at least bucket_bytes (DDP's rule), not before "
                      "they would exceed it")
        raise Bad(f"plan_buckets(tensors of {[p.numel() for p in params]} float32, {cap}): expected {want}, got {got}")


def case_buckets(ns: dict) -> dict:
    _check_plan(ns["plan_buckets"])
    cls = ns["BucketedGradSync"]
    rank, world = _world()
    ref = _reference_grads(steps=2, set_to_none=(True, False))
    model = _mlp()
    params = list(model.parameters())
    cap = 100  # bytes: buckets [8, 7, 6, 5] [4] [3, 2] and the last, partial [1, 0] (84 bytes)
    plan = _ref_plan(params, cap)
    sizes = [sum(params[i].numel() for i in b) for b in plan]
    sync = cls(model, cap)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    diffs = {}
    for step, set_to_none in ((0, True), (1, False)):
        timeline = Timeline()
        opt.zero_grad(set_to_none=set_to_none)
        with record_collectives(timeline):
            _loss_backward(model, _local(_global_batch(world, step), rank), timeline)
            sync.finish()
        launched = [e["numel"] for e in timeline.collectives() if e["during"] == "backward"]
        if step == 1 and not launched:
            raise Bad("no bucket was launched in the second step: reset self.ready (and self.pending) in finish()")
        _expect(not getattr(sync, "pending", None), "empty self.pending at the end of finish(): otherwise the next "
                                                    "finish() waits for and unpacks this step's buckets once more")
        if sorted(launched) == sorted(p.numel() for p in params):
            raise Bad("one all-reduce per parameter: copy each gradient into its bucket's flat buffer and all-reduce "
                      "the buffer once, when the bucket holds all its gradients")
        if launched and sorted(launched) == sorted(sizes[:-1]):
            raise Bad("the last, partial bucket was never all-reduced: launch a bucket when all its gradients are "
                      "in (self.ready[b] == len(self.plan[b])), not when it holds bucket_bytes")
        _check_async_collectives(timeline, len(plan), "buckets", "_on_grad_ready, the hook")
        _expect(sorted(launched) == sorted(sizes), f"the all-reduced buffers hold {sorted(launched)} values, the "
                                                   f"buckets {sorted(sizes)}: all-reduce each bucket's whole buffer")
        diffs = _diagnose(_grads(model), ref, step)
        opt.step()
    return diffs


class _Probe(Exception):
    pass


class _DDPAdapter:
    def __init__(self, model: nn.Module) -> None:
        self.model, self.require_sync = model, True

    def no_sync(self):
        return self.model.no_sync()

    def finish(self) -> None:
        pass


def _ref_sync_class(base: type) -> type:
    class ReferenceSync(base):  # a correct per-parameter overlap, on the student's GradSync (its no_sync)
        def __init__(self, model: nn.Module) -> None:
            base.__init__(self, model)
            self.pending = []
            for p in model.parameters():
                self.hook_handles.append(p.register_post_accumulate_grad_hook(self._ready))

        def _ready(self, param):
            if self.require_sync:
                self.pending.append((dist.all_reduce(param.grad, async_op=True), param.grad))

        def finish(self) -> None:
            for work, grad in self.pending:
                work.wait()
                grad.div_(dist.get_world_size())
            self.pending.clear()

    return ReferenceSync


def case_no_sync(ns: dict) -> dict:
    step_fn, base = ns["train_step_accumulated"], ns["GradSync"]
    rank, world = _world()
    k = 3
    data = _local(_global_batch(world), rank)
    micro = [(data[0][i::k], data[1][i::k]) for i in range(k)]
    ref = _reference_grads()
    model = _mlp()
    n = len(list(model.parameters()))
    sync = _ref_sync_class(base)(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    timeline = Timeline()
    with record_collectives(timeline):
        step_fn(model, sync, micro, F.cross_entropy, opt)
    count = len(timeline.collectives())
    _expect(sync.require_sync is True, "no_sync() must set require_sync back when its block ends (try/finally): "
                                       "otherwise no later backward communicates")
    _expect(count != k * n, f"{count} all-reduces for {k} micro-batches: it communicated on every micro-batch; run "
                            "the first k - 1 forward and backward passes inside sync.no_sync()")
    _expect(count != 0, "nothing was all-reduced: the last micro-batch must run outside no_sync(), then sync.finish()")
    _expect(count == n, f"{count} all-reduces for one step of {n} parameters: the last micro-batch's backward "
                        "only (one per parameter)")
    probe = _ref_sync_class(base)(_mlp())
    with contextlib.suppress(_Probe):
        with probe.no_sync():
            raise _Probe()
    _expect(probe.require_sync is True, "no_sync() must set require_sync back even when its block raises (try/finally): "
                                        "otherwise every later step silently trains each rank alone")
    got = _grads(model)
    single = ref["single"][0]
    if all(g is not None for g in got) and _far(got, [g * k for g in single]) <= 1:
        raise Bad(f"the gradients are {k} times too large: divide each micro-batch's loss by k (the k backward passes "
                  "add up in p.grad)")
    if all(g is not None for g in got) and _far(got, single) > 1:
        last = _mlp()
        F.cross_entropy(last(micro[-1][0]), micro[-1][1]).backward()
        if world == 1 and _far(got, [p.grad / k for p in last.parameters()]) <= 1:
            raise Bad("only the last micro-batch's gradient is left: zero the gradients once, before the loop")
    diffs = _diagnose(got, ref, 0)
    _expect(any(not torch.equal(b, p) for b, p in zip(before, model.parameters())),
            "the weights did not change: call optimizer.step() once, after sync.finish()")
    # DDP decides during the forward whether the next backward communicates: forward inside no_sync() too.
    ddp = DDP(_mlp())
    ddp.register_comm_hook(None, default_hooks.allreduce_hook)  # DDP's all-reduces then go through dist.all_reduce
    timeline = Timeline()
    with record_collectives(timeline):
        step_fn(ddp, _DDPAdapter(ddp), micro, F.cross_entropy, torch.optim.SGD(ddp.parameters(), lr=0.1))
    launches = len(timeline.collectives())
    _expect(launches == 1, f"with DDP, {launches} bucket all-reduces instead of 1: DDP arms its hooks during the "
                           "forward, so run the first k - 1 forwards inside no_sync() as well as their backwards")
    diffs["ddp_no_sync"] = _diagnose(_grads(ddp.module), ref, 0, what="DDP's p.grad")["ddp"]
    return diffs


CASES: dict[str, Callable[[dict], dict]] = {"naive": case_naive, "broadcast": case_broadcast, "overlap": case_overlap,
                                            "buckets": case_buckets, "no_sync": case_no_sync}


def run_case(step: str, ns: dict) -> dict:
    """``{"verdict": "ok" | message, "diffs": {...}}`` of one step; the student's NotImplementedError propagates."""
    try:
        return {"verdict": "ok", "diffs": CASES[step](ns)}
    except Bad as exc:
        return {"verdict": str(exc), "diffs": {}}
