"""The cases behind ``dlo check dp_scratch <step>`` (Jour2/dp_scratch_train.py): one function per step, run at any
world size, in a process group of one (the checker's own process) or on several gloo processes
(``checks/dp_scratch_worker.py``). Outside the ``checks`` package so that the worker processes start without
importing every course's checkers.

What is checked is behaviour, end to end, on inputs chosen so that the usual mistakes show:

* every step trains (or broadcasts) and then compares the *weights* with those of one process on the global
  batch, on every rank (so the ranks also agree with each other), besides the gradients;
* two set-ups (:data:`SETUPS`): different seeds, fp32 and fp64, a frozen layer (``requires_grad=False``: no
  gradient at all), and two ways of dealing the samples to the ranks; the bucket plan is also asked for
  bf16 / fp16 / fp64 tensors and for bucket sizes that divide nothing;
* every all-reduce is seen through :func:`dlo.parallel.dp_events.record_collectives` with ``defer=True``:
  an asynchronous result reaches its tensor only when its handle is waited for, and the order of the
  events says whether backward went on between a launch and its wait (overlap) or not;
* the broadcasts of step 2 are first played as if this rank were a receiving one (each call fills its
  tensor with a recognisable value, an asynchronous one only at its wait()), counted and compared across
  ranks, so that a broadcast called on some ranks only is reported instead of hanging the run; then the
  function runs again for real and the state must be rank 0's.

A failure names the mistake when it is a known one; otherwise it gives the measured difference.
"""
from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from dlo.parallel.dp_events import Timeline, record_collectives

TOL = 1e-6  # gradients and weights: |got - expected| <= TOL + TOL * |expected|
STEPS = ("naive", "broadcast", "overlap", "buckets", "no_sync")
PER_RANK = 6  # samples per rank (3 micro-batches of 2 in the no_sync step)
LR = 0.1  # plain SGD: the step's effective gradient is (weights before - weights after) / LR
K = 3  # micro-batches per step in the no_sync step


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
# Set-ups, models, data
# ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Setup:
    seed: int
    dtype: torch.dtype
    frozen: bool  # one hidden layer has requires_grad=False (no .grad, but gradients flow through it)
    interleave: bool  # samples dealt to the ranks in turn (True) or in contiguous slices (False)

    def __str__(self) -> str:
        return (f"seed {self.seed}, {str(self.dtype).replace('torch.', '')}, "
                + ("a frozen layer, " if self.frozen else "")
                + ("samples dealt in turn" if self.interleave else "contiguous slices"))


SETUPS = (Setup(0, torch.float32, False, False), Setup(1, torch.float64, True, True))


@contextlib.contextmanager
def _in(setup: Setup):
    """Adds the set-up to a failure's message, so that the student can reproduce it."""
    try:
        yield
    except Bad as exc:
        raise Bad(f"{exc} [set-up: {setup}]") from None


def _mlp(setup: Setup = SETUPS[0]) -> nn.Module:
    """Nine parameter tensors of different sizes, one layer without bias, small first layers (so that a bucket
    plan has a last, partial bucket); no BatchNorm (so that one process on the global batch computes the same
    gradients). With ``setup.frozen`` the second Linear layer is frozen."""
    torch.manual_seed(setup.seed)
    model = nn.Sequential(nn.Linear(6, 3), nn.Tanh(), nn.Linear(3, 7), nn.Tanh(), nn.Linear(7, 5, bias=False),
                          nn.Tanh(), nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3)).to(setup.dtype)
    if setup.frozen:
        model[2].requires_grad_(False)
    return model


def _names(model: nn.Module, idx) -> list[str]:
    names = [n for n, _ in model.named_parameters()]
    return [names[i] for i in idx]


def _world() -> tuple[int, int]:
    return dist.get_rank(), dist.get_world_size()


def _owner(setup: Setup, world: int) -> torch.Tensor:
    """Which rank each sample of the global batch goes to."""
    i = torch.arange(world * PER_RANK)
    return i % world if setup.interleave else i // PER_RANK


def _global_batch(setup: Setup, world: int, step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(50 + 100 * setup.seed + step)
    x = torch.randn(world * PER_RANK, 6, generator=gen, dtype=torch.float64)
    x = (x * (1 + _owner(setup, world))[:, None]).to(setup.dtype)  # the ranks' samples differ in scale
    return x, torch.randint(0, 3, (world * PER_RANK,), generator=gen)


def _local(setup: Setup, batch, rank: int, world: int):
    rows = (_owner(setup, world) == rank).nonzero().flatten()
    return batch[0][rows], batch[1][rows]


def _grads(model: nn.Module) -> list[torch.Tensor | None]:
    return [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()]


def _weights(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _trainable(model: nn.Module) -> list[bool]:
    return [p.requires_grad for p in model.parameters()]


def _reference(setup: Setup, steps: int) -> list[dict]:
    """Per step, from the weights one process has at that step: this rank's slice's gradients alone
    (``local``), DDP's, those of one process on the global batch (``single``), its weights before and after
    SGD(lr LR), and the gradients of this rank's last micro-batch (``last``, divided by K)."""
    rank, world = _world()
    single, ddp = _mlp(setup), DDP(_mlp(setup))
    opt_s, opt_d = (torch.optim.SGD(m.parameters(), lr=LR) for m in (single, ddp))
    out = []
    for step in range(steps):
        batch = _global_batch(setup, world, step)
        data = _local(setup, batch, rank, world)
        local = copy.deepcopy(single)
        F.cross_entropy(local(data[0]), data[1]).backward()
        last = copy.deepcopy(single)
        F.cross_entropy(last(data[0][K - 1::K]), data[1][K - 1::K]).backward()
        with torch.no_grad():
            losses = [float(F.cross_entropy(single(data[0][i::K]), data[1][i::K])) for i in range(K)]
        start = _weights(single)
        opt_s.zero_grad()
        F.cross_entropy(single(batch[0]), batch[1]).backward()
        opt_s.step()
        opt_d.zero_grad()
        F.cross_entropy(ddp(data[0]), data[1]).backward()
        opt_d.step()
        out.append({"start": start, "after": _weights(single), "single": _grads(single), "ddp": _grads(ddp.module),
                    "local": _grads(local), "last": [None if g is None else g / K for g in _grads(last)],
                    "micro_losses": losses, "data": data})
    return out


# ----------------------------------------------------------------------------------------------------
# Comparing, and naming what differs
# ----------------------------------------------------------------------------------------------------
def _close(got: torch.Tensor | None, want: torch.Tensor | None, tol: float = TOL) -> bool:
    if got is None or want is None or got.shape != want.shape:
        return False
    got, want = got.double(), want.double()
    return bool(((got - want).abs() <= tol + tol * want.abs()).all())


def _max_diff(got: list, want: list, keep: list[bool]) -> float:
    out = 0.0
    for g, w, k in zip(got, want, keep):
        if k:
            out = max(out, float((g.double() - w.double()).abs().max()) if g is not None and g.shape == w.shape
                      else float("inf"))
    return out


def _classify(got: list, ref: dict, keep: list[bool], tol: float, extra: dict | None = None) -> dict[str, list[int]]:
    """Each kept parameter's gradient: "ok" (the average), or which known wrong value it equals."""
    _, world = _world()
    patterns: dict[str, list] = {"ok": ref["single"]}
    if world > 1:
        patterns["sum"] = [None if g is None else g * world for g in ref["single"]]
        patterns["twice"] = [None if g is None else g / world for g in ref["single"]]
        patterns["local"] = ref["local"]
    patterns.update(extra or {})
    out: dict[str, list[int]] = {}
    for i, (g, k) in enumerate(zip(got, keep)):
        if not k:
            continue
        if g is None:
            out.setdefault("missing", []).append(i)
            continue
        kind = next((name for name, want in patterns.items() if _close(g, want[i], tol)), "other")
        out.setdefault(kind, []).append(i)
    return out


_GRAD_MESSAGES = {
    "sum": "the gradients are {world} times (the world size) too large: all_reduce sums, the sum must still be "
           "divided by the number of ranks",
    "twice": "the gradients are {world} times (the world size) too small: they were divided twice (ReduceOp.AVG "
             "already averages; or the same gradients were divided again)",
    "local": "{what} still holds this rank's own gradient: no average reached it (the all-reduce must act on the "
             "gradient tensor itself, in place, not on a copy, and any result must be copied back where the "
             "optimizer reads it)",
}


_WEIGHT_MESSAGES = {
    "sum": "the step used gradients {world} times (the world size) too large: summed over the ranks, not averaged",
    "twice": "the step used gradients {world} times (the world size) too small: they were divided twice",
    "local": "the step used this rank's own gradient, not the average: the ranks' weights differ",
}


def _common_ratio(got: list, want: list, keep: list[bool]) -> float | None:
    """r when every kept gradient is r times the expected one (r not 1, nor the world size or its inverse)."""
    pairs = [(g.double(), w.double()) for g, w, k in zip(got, want, keep) if k and g is not None and g.shape == w.shape]
    den = sum(float((w * w).sum()) for _, w in pairs)
    if not pairs or den == 0:
        return None
    r = sum(float((g * w).sum()) for g, w in pairs) / den
    _, world = _world()
    if any(abs(r - x) < 1e-6 * max(1.0, x) for x in (1.0, float(world), 1.0 / world)):
        return None
    return r if all(_close(g, w * r, 1e-5) for g, w in pairs) else None


def _diagnose(got: list, ref: dict, model: nn.Module, what: str = "p.grad") -> dict:
    """Check gradients against one process's and DDP's; raise Bad naming the likely mistake."""
    rank, world = _world()
    keep = _trainable(model)
    kinds = _classify(got, ref, keep, TOL)
    if "missing" in kinds:
        raise Bad(f"{what} is None for {_names(model, kinds['missing'])} after finishing: every trained parameter "
                  "needs its averaged gradient")
    diffs = {"ddp": _max_diff(got, ref["ddp"], keep), "single": _max_diff(got, ref["single"], keep)}
    if set(kinds) == {"ok"}:
        return diffs
    wrong = [k for k in kinds if k != "ok"]
    ratio = _common_ratio(got, ref["single"], keep)
    if ratio is not None:
        raise Bad(f"the gradients are {ratio:.3g} times the average: the sum over the ranks must be divided by the "
                  f"world size ({world} here, dist.get_world_size()), not by a fixed number")
    if len(wrong) == 1 and wrong[0] in _GRAD_MESSAGES:
        message = _GRAD_MESSAGES[wrong[0]].format(world=world, what=what)
        if "ok" in kinds:
            message = f"{_names(model, kinds[wrong[0]])} only: " + message
        raise Bad(message)
    raise Bad(f"the gradients differ from one process's on the global batch by up to {diffs['single']:.2g} "
              f"(allowed: {TOL:g} + {TOL:g} x |g|) and from DDP's by up to {diffs['ddp']:.2g}")


def _check_weights(model: nn.Module, before: list, ref: dict, *, context: str = "", extra: dict | None = None,
                   messages: dict | None = None) -> None:
    """The weights after the step must be one process's (so equal on every rank). Otherwise the effective
    gradient (before - after) / LR says what the step used."""
    rank, world = _world()
    after = _weights(model)
    keep = _trainable(model)
    moved = [n for n, b, a, k in zip(_names(model, range(len(after))), before, after, keep)
             if not k and not torch.equal(b, a)]
    _expect(not moved, f"the frozen parameter(s) {moved} changed: a parameter with requires_grad=False must not "
                       "be trained")
    if all(_close(a, w) for a, w, k in zip(after, ref["after"], keep) if k):
        return
    effective = [(b.double() - a.double()) / LR for b, a in zip(before, after)]
    if all(float(e.abs().max()) == 0 for e, k in zip(effective, keep) if k):
        raise Bad("the weights did not change: optimizer.step() must run once, after the gradients are averaged")
    kinds = _classify(effective, ref, keep, 1e-4, extra)
    wrong = [k for k in kinds if k != "ok"]
    messages = {**_WEIGHT_MESSAGES, **(messages or {})}
    if len(wrong) == 1 and wrong[0] in messages:
        raise Bad(messages[wrong[0]].format(world=world, what="p.grad", k=K) + context)
    diff = _max_diff(after, ref["after"], keep)
    raise Bad(f"after the optimizer step the weights differ from one process's on the global batch by up to "
              f"{diff:.2g}{context}")


def _loss_backward(model: nn.Module, data, timeline: Timeline | None = None) -> None:
    loss = F.cross_entropy(model(data[0]), data[1])
    with (timeline.span("backward") if timeline is not None else contextlib.nullcontext()):
        loss.backward()


def _frozen_error(setup: Setup, exc: Exception, what: str) -> Bad:
    return Bad(f"{what} raised {type(exc).__name__} on a model with a frozen layer ({' '.join(str(exc).split())[:120]}):"
               " a parameter with requires_grad=False never gets a gradient (p.grad stays None) and needs no "
               "average, so it must be skipped")


# ----------------------------------------------------------------------------------------------------
# Step 1: naive
# ----------------------------------------------------------------------------------------------------
def case_naive(ns: dict) -> dict:
    allreduce_gradients = ns["allreduce_gradients"]
    rank, world = _world()
    diffs: dict = {}
    for setup in SETUPS:
        with _in(setup):
            ref = _reference(setup, steps=2)
            model = _mlp(setup)
            opt = torch.optim.SGD(model.parameters(), lr=LR)
            for step, set_to_none in ((0, True), (1, False)):
                opt.zero_grad(set_to_none=set_to_none)
                _loss_backward(model, ref[step]["data"])
                timeline = Timeline()
                with record_collectives(timeline, defer=True):
                    try:
                        allreduce_gradients(model)
                    except (AttributeError, TypeError, ValueError, RuntimeError) as exc:
                        if setup.frozen:
                            raise _frozen_error(setup, exc, "allreduce_gradients") from None
                        raise
                _expect(timeline.collectives(), "no torch.distributed.all_reduce call was seen: every gradient "
                                                "must be all-reduced (dist.all_reduce)")
                _check_handles(timeline.collectives())
                diffs = _diagnose(_grads(model), ref[step], model)
                before = _weights(model)
                opt.step()
                _check_weights(model, before, ref[step])
    return diffs


def _check_handles(calls: list[dict]) -> None:
    never = [e for e in calls if e["wait_seq"] is None]
    _expect(not never, f"{len(never)} of {len(calls)} asynchronous all-reduce handles are never waited for: an "
                       "all-reduce launched with async_op=True has not averaged anything until its wait() returns")


# ----------------------------------------------------------------------------------------------------
# Step 2: broadcast
# ----------------------------------------------------------------------------------------------------
def _bn_net(seed: int, setup: Setup) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 5), nn.BatchNorm1d(5), nn.ReLU(), nn.Linear(5, 3)).to(setup.dtype)
    if setup.frozen:
        model[0].requires_grad_(False)
    return model


def _rank_dependent(model: nn.Module, rank: int) -> nn.Module:
    """Buffers that differ per rank, as after a few training steps on different data."""
    with torch.no_grad():
        model[1].running_mean.add_(rank + 1.0)
        model[1].running_var.mul_(rank + 2.0)
        model[1].num_batches_tracked.fill_(rank + 3)
    return model


def _broadcast_model(setup: Setup, rank: int) -> nn.Module:
    return _rank_dependent(_bn_net(100 + 10 * setup.seed + rank, setup), rank)


class _Handle:
    """What an asynchronous recorded broadcast returns: not completed until waited for."""

    def __init__(self, land: Callable[[], None], call: dict) -> None:
        self._land, self._call = land, call

    def wait(self, *a, **k) -> bool:
        if not self._call["waited"]:
            self._call["waited"] = True
            self._land()
        return True

    def is_completed(self) -> bool:
        return self._call["waited"]


class _RecordedBroadcasts:
    """dist.broadcast replaced. ``receive=True``: nothing is communicated, each call fills its tensor with a
    value of its own (as if rank 0 had sent it), an asynchronous call only at its wait(). ``receive=False``:
    the real broadcast, into a copy when asynchronous, copied into the tensor at wait()."""

    def __init__(self, receive: bool) -> None:
        self.receive = receive
        self.calls: list[dict] = []
        self.real = dist.broadcast

    def marker(self, j: int, tensor: torch.Tensor) -> float | int:
        return 1000 + j if not tensor.is_floating_point() else j + 0.5

    def __call__(self, tensor, src=None, group=None, async_op=False, group_src=None):
        call = {"tensor": tensor, "src": src if src is not None else group_src, "group": group,
                "async_op": bool(async_op), "waited": not async_op}
        self.calls.append(call)
        j = len(self.calls) - 1
        if self.receive:
            def land() -> None:
                with torch.no_grad():
                    tensor.fill_(self.marker(j, tensor))
        else:
            target = tensor.detach().clone() if async_op else tensor
            work = self.real(target, src=call["src"], group=group, async_op=bool(async_op))

            def land() -> None:
                if async_op:
                    work.wait()
                    with torch.no_grad():
                        tensor.copy_(target)
        if not async_op:
            land()
            return None
        return _Handle(land, call)

    @contextlib.contextmanager
    def active(self):
        dist.broadcast = self
        try:
            yield self
        finally:
            dist.broadcast = self.real


def case_broadcast(ns: dict) -> dict:
    broadcast_state = ns["broadcast_state"]
    rank, world = _world()
    for setup in SETUPS:
        with _in(setup):
            _broadcast_once(broadcast_state, setup, rank, world)
    return {}


def _broadcast_once(broadcast_state: Callable, setup: Setup, rank: int, world: int) -> None:
    # 1. as a receiving rank would see it, without communicating
    model = _broadcast_model(setup, rank)
    recorder = _RecordedBroadcasts(receive=True)
    with recorder.active():
        broadcast_state(model)
    calls = recorder.calls
    srcs = sorted({int(c["src"]) if c["src"] is not None else -1 for c in calls})
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, {"calls": len(calls), "srcs": srcs})
    counts = [e["calls"] for e in everyone]
    _expect(any(counts), "dist.broadcast was never called: every parameter and buffer must come from rank 0")
    _expect(len(set(counts)) == 1,
            f"the ranks called dist.broadcast {counts} times: every rank must call it, the same number of times "
            "(rank 0 sends, the others receive; a broadcast on rank 0 only waits forever)")
    sources = [e["srcs"] for e in everyone]
    if world > 1 and all(s == [r] for r, s in enumerate(sources)):
        raise Bad("each rank named itself as the source: src must be 0 on every rank (rank 0's copy is the reference)")
    _expect(all(s == [0] for s in sources), f"the source must be rank 0 (src=0) on every rank, got sources {sources}")
    never = [c for c in calls if not c["waited"]]
    _expect(not never, f"{len(never)} of {len(calls)} asynchronous broadcast handles are never waited for: what "
                       "rank 0 sends has not arrived until wait() returns")
    markers = [recorder.marker(j, c["tensor"]) for j, c in enumerate(calls)]

    def received(t: torch.Tensor) -> bool:  # holds one call's value everywhere (a flat buffer copied back too)
        return any(bool((t == m).all()) for m in markers)

    missing_p = [n for n, p in model.named_parameters() if not received(p)]
    missing_b = [n for n, b in model.named_buffers() if not received(b)]
    _expect(not missing_p, f"parameter(s) {missing_p} did not receive rank 0's values: what is broadcast must end in "
                           "the parameter itself (broadcast the tensor in place, not a copy, or copy what a copy "
                           "received back into the parameter)")
    _expect(not missing_b, f"buffers {missing_b} did not receive rank 0's values: buffers (BatchNorm's running "
                           "statistics) are state too, and DDP broadcasts them (model.buffers())")
    # 2. for real: every rank must end with rank 0's state
    model = _broadcast_model(setup, rank)
    reference = _broadcast_model(setup, 0)
    with _RecordedBroadcasts(receive=False).active():
        broadcast_state(model)
    for (name, got), want in zip(model.state_dict().items(), reference.state_dict().values()):
        _expect(torch.equal(got, want), f"after the broadcasts, {name} differs from rank 0's")


# ----------------------------------------------------------------------------------------------------
# Steps 3 and 4: overlap, buckets
# ----------------------------------------------------------------------------------------------------
def _check_async_collectives(timeline: Timeline, expected: int, unit: str) -> None:
    calls = timeline.collectives()
    during = [e for e in calls if e["during"] == "backward"]
    _expect(calls, "no all-reduce was launched: the hooks registered in __init__ must launch them during backward")
    _expect(during, "the all-reduces ran after backward, not during it: each one must be launched from the hook "
                    "(register_post_accumulate_grad_hook), while backward goes on")
    blocking = [e for e in during if not e["async_op"]]
    _expect(not blocking, "the all-reduce inside the hook blocks: backward stops until it completes, so nothing "
                          "overlaps backward (an asynchronous launch, async_op=True, returns at once)")
    _check_handles(calls)
    at_once = [e for e in during if e["wait_during"] == "backward" and e["wait_seq"] == e["seq"] + 1]
    _expect(not at_once, f"{len(at_once)} of {len(during)} all-reduces are waited for inside the hook, right after "
                         "their launch: nothing overlaps backward (keep the handles, wait for them in finish(), "
                         "once backward is over)")
    after = [e for e in calls if e["during"] != "backward"]
    _expect(not after, f"{len(after)} all-reduces were launched after backward: every one belongs in the hook")
    _expect(len(during) == expected, f"{len(during)} all-reduces during backward for {expected} {unit}: one per "
                                     f"{unit.rstrip('s')}, launched once (hooks registered once, in __init__)")


def _construct(make: Callable, model: nn.Module, setup: Setup, what: str):
    try:
        return make(model)
    except RuntimeError as exc:
        if setup.frozen and "require" in str(exc) and "grad" in str(exc):
            raise _frozen_error(setup, exc, what) from None
        raise


def _run_sync(make: Callable, setup: Setup, what: str, launched_check: Callable[[list, int], None] | None,
              expected: Callable[[nn.Module], tuple[int, str]]) -> dict:
    rank, world = _world()
    ref = _reference(setup, steps=2)
    model = _mlp(setup)
    sync = _construct(make, model, setup, what)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    diffs: dict = {}
    for step, set_to_none in ((0, True), (1, False)):
        timeline = Timeline()
        opt.zero_grad(set_to_none=set_to_none)
        with record_collectives(timeline, defer=True):
            _loss_backward(model, ref[step]["data"], timeline)
            with timeline.span("finish"):
                try:
                    sync.finish()
                except (AttributeError, TypeError) as exc:
                    if setup.frozen and "None" in str(exc):
                        raise _frozen_error(setup, exc, "finish()") from None
                    raise
        if launched_check is not None:
            launched_check([e["numel"] for e in timeline.collectives() if e["during"] == "backward"], step)
        _check_async_collectives(timeline, *expected(model))
        _expect(not getattr(sync, "pending", None), "self.pending must be empty at the end of finish(): otherwise "
                                                    "the next finish() waits for and divides this step's work again")
        diffs = _diagnose(_grads(model), ref[step], model)
        before = _weights(model)
        opt.step()
        _check_weights(model, before, ref[step])
    return diffs


def case_overlap(ns: dict) -> dict:
    cls = ns["OverlappedGradSync"]
    diffs: dict = {}
    for setup in SETUPS:
        with _in(setup):
            diffs = _run_sync(cls, setup, "OverlappedGradSync(model)", None,
                              lambda m: (sum(_trainable(m)), "trained parameters"))
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


#: The plan's inputs: sizes and dtypes (2, 2, 4, 8 bytes per element), and bucket sizes in bytes, some of which
#: divide no tensor's size.
PLAN_PARAMS = ((10, torch.float32), (3, torch.bfloat16), (7, torch.float16), (20, torch.float32),
               (5, torch.float64), (8, torch.bfloat16), (2, torch.float32), (9, torch.float16))
PLAN_CAPS = (40, 48, 30, 1, 10**9)


def _normalised(plan) -> list[list[int]] | None:
    """A plan with each bucket's indices sorted: the order inside a bucket does not matter."""
    try:
        return [sorted(int(i) for i in b) for b in plan]
    except TypeError:
        return None


def _check_plan(plan_buckets: Callable) -> None:
    params = [torch.empty(n, dtype=d) for n, d in PLAN_PARAMS]
    got = {cap: _normalised(plan_buckets(params, cap)) for cap in PLAN_CAPS}
    want = {cap: _normalised(_ref_plan(params, cap)) for cap in PLAN_CAPS}
    if got == want:
        return
    known = (
        ("the buckets must be filled in reverse registration order: the last parameters' gradients are ready first",
         {"reverse": False}),
        ("bucket_bytes is in bytes: a gradient's size is numel() * element_size(), not numel()",
         {"size": lambda p: p.numel()}),
        ("the byte count assumes 4-byte elements: bf16 and fp16 gradients take 2 bytes per element, fp64 8; "
         "numel() * element_size() is the size in bytes", {"size": lambda p: p.numel() * 4}),
        ("a bucket closes once its gradients add up to at least bucket_bytes (DDP's rule), not before they would "
         "exceed it", {"strict": True}),
    )
    for message, kwargs in known:
        if all(got[c] == _normalised(_ref_plan(params, c, **kwargs)) for c in PLAN_CAPS):
            raise Bad(message)
    if all(got[c] in (want[c], want[c][:-1]) for c in PLAN_CAPS):  # dropped wherever a partial one is left
        raise Bad("the last, partial bucket is missing: what remains after the loop is a bucket too")
    cap = next(c for c in PLAN_CAPS if got[c] != want[c])
    raise Bad(f"plan_buckets(tensors of {[(n, str(d).replace('torch.', '')) for n, d in PLAN_PARAMS]}, {cap} bytes): "
              f"expected {want[cap]}, got {got[cap]}")


def case_buckets(ns: dict) -> dict:
    _check_plan(ns["plan_buckets"])
    cls = ns["BucketedGradSync"]
    diffs: dict = {}
    for setup in SETUPS:
        with _in(setup):
            probe = _mlp(setup)
            params = [p for p in probe.parameters() if p.requires_grad]
            cap = 100  # bytes: fp32 [8, 7, 6, 5] [4] [3, 2] and the last, partial [1, 0]; fp64 another plan
            plan = _ref_plan(params, cap)
            sizes = sorted(sum(params[i].numel() for i in b) for b in plan)

            def launched_check(launched: list[int], step: int) -> None:
                if step == 1 and not launched:
                    raise Bad("no bucket was launched in the second step: the ready counts (self.ready) must be "
                              "reset in finish()")
                if len(params) > 1 and sorted(launched) == sorted(p.numel() for p in params):
                    raise Bad("one all-reduce per parameter: each gradient must be copied into its bucket's flat "
                              "buffer, and the buffer all-reduced once, when the bucket holds all its gradients")
                if launched and sorted(launched) == sorted(sum(params[i].numel() for i in b) for b in plan[:-1]):
                    raise Bad("the last, partial bucket was never all-reduced: a bucket is launched when all its "
                              "gradients are in (self.ready[b] == len(self.plan[b])), not when it holds bucket_bytes")
                _expect(sorted(launched) == sizes, f"the all-reduced buffers hold {sorted(launched)} values, the "
                                                   f"buckets {sizes}: each bucket's whole buffer is all-reduced once")

            diffs = _run_sync(lambda m: cls(m, cap), setup, "BucketedGradSync(model, bucket_bytes)", launched_check,
                              lambda m: (len(plan), "buckets"))
    return diffs


# ----------------------------------------------------------------------------------------------------
# Step 5: no_sync
# ----------------------------------------------------------------------------------------------------
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
                if p.requires_grad:
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


def _micro(data) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(data[0][i::K], data[1][i::K]) for i in range(K)]


def _check_loss(returned: Any, ref: dict) -> None:
    _expect(returned is not None, "train_step_accumulated returned nothing: it must return the mean loss of its "
                                  "k micro-batches")
    if isinstance(returned, torch.Tensor):
        _expect(not returned.requires_grad, "the returned loss still requires grad: return a detached value, or it "
                                            "keeps every micro-batch's graph alive")
        _expect(returned.numel() == 1, f"the returned loss has {returned.numel()} values: it must be one number")
    value = float(returned)
    losses = ref["micro_losses"]
    mean = sum(losses) / K

    def near(x: float) -> bool:
        return abs(value - x) <= 1e-5 + 1e-5 * abs(x)

    if near(mean):
        return
    known = ((losses[-1], "the returned loss is the last micro-batch's, not the mean over the k micro-batches"),
             (losses[-1] / K, "the returned loss is the last micro-batch's (divided by k), not the mean over the k "
                              "micro-batches"),
             (mean * K, "the returned loss is k times the mean: the k losses were added up without dividing by k"),
             (mean / K, "the returned loss is k times too small: the mean was divided by k once more"))
    for x, message in known:
        if near(x):
            raise Bad(message)
    raise Bad(f"the returned loss is {value:.6g}; the mean of the k micro-batches' losses is {mean:.6g}")


def case_no_sync(ns: dict) -> dict:
    step_fn, base = ns["train_step_accumulated"], ns["GradSync"]
    rank, world = _world()
    probe = _ref_sync_class(base)(_mlp())
    with contextlib.suppress(_Probe):
        with probe.no_sync():
            raise _Probe()
    _expect(probe.require_sync is True, "no_sync() must set require_sync back even when its block raises (try/finally): "
                                        "otherwise every later step silently trains each rank alone")
    diffs: dict = {}
    for setup in SETUPS:
        with _in(setup):
            diffs = _no_sync_setup(step_fn, base, setup)
    for setup in SETUPS:
        with _in(setup):
            diffs["ddp_no_sync"] = _no_sync_under_ddp(step_fn, setup)
    return diffs


def _no_sync_setup(step_fn: Callable, base: type, setup: Setup) -> dict:
    rank, world = _world()
    ref = _reference(setup, steps=2)
    model = _mlp(setup)
    n = sum(_trainable(model))
    sync = _ref_sync_class(base)(model)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    timeline = Timeline()

    def stepped(*_: Any) -> None:  # where the optimizer step comes in the order of events
        timeline.add("compute", "optimizer.step", timeline.mark(), timeline.mark(), seq=timeline.next_seq())

    opt.register_step_pre_hook(stepped)
    for step in range(2):
        timeline.clear()
        before = _weights(model)
        with record_collectives(timeline, defer=True):
            returned = step_fn(model, sync, _micro(ref[step]["data"]), F.cross_entropy, opt)
        _expect(sync.require_sync is True, "no_sync() must set require_sync back when its block ends (try/finally): "
                                           "otherwise no later backward communicates")
        calls = timeline.collectives()
        count = len(calls)
        _expect(count != K * n, f"{count} all-reduces for {K} micro-batches: it communicated on every micro-batch; "
                                "the first k - 1 forward and backward passes belong inside sync.no_sync()")
        _expect(count != 0, "nothing was all-reduced: the last micro-batch must run outside no_sync(), followed by "
                            "sync.finish()")
        _expect(count == n, f"{count} all-reduces for one step of {n} trained parameters: only the last micro-batch's "
                            "backward communicates (one per parameter)")
        steps = [e for e in timeline.events if e["name"] == "optimizer.step"]
        _expect(steps, "optimizer.step() was never called: the accumulated, averaged gradients must be applied once")
        _expect(len(steps) == 1, f"optimizer.step() was called {len(steps)} times for one accumulated step: once, "
                                 "after the last micro-batch")
        never = [e for e in calls if e["wait_seq"] is None]
        _expect(not never, f"{len(never)} of {count} all-reduce handles are never waited for: sync.finish() must run "
                           "before optimizer.step(), or the step uses gradients that are not averaged yet")
        late = [e for e in calls if e["wait_seq"] > steps[0]["seq"]]
        _expect(not late, "the optimizer stepped before the gradients were averaged (sync.finish() came after "
                          "optimizer.step()): each rank stepped with its own gradient, so the ranks' weights differ")
        previous = {"stale": [None if a is None else a + b for a, b in zip(ref[step]["single"], ref[step - 1]["single"])]
                    } if step == 1 else {}
        _check_weights(
            model, before, ref[step], context=f" (step {step + 1} of 2)",
            extra={"times_k": [None if g is None else g * K for g in ref[step]["single"]],
                   "last": ref[step]["last"] if world == 1 else [None] * len(before), **previous},
            messages={"times_k": "the step used gradients {k} times too large: each micro-batch's loss must be "
                                 "divided by k (the k backward passes add up in p.grad)",
                      "last": "only the last micro-batch's gradient is left: zero the gradients once, before the "
                              "loop, not before every micro-batch",
                      "stale": "the previous step's gradients were still in p.grad: zero the gradients once per "
                               "step, before the first micro-batch (or after the optimizer step)",
                      "local": "the step used this rank's own gradient, not the average: the ranks' weights differ "
                               "(the optimizer must step after sync.finish())"})
        _check_loss(returned, ref[step])
    # DDP decides during the forward whether the next backward communicates: forward inside no_sync() too.
    return {"single": _max_diff(_weights(model), ref[-1]["after"], _trainable(model))}


def _no_sync_under_ddp(step_fn: Callable, setup: Setup) -> float:
    """The student's step with DDP's own no_sync(): DDP decides during the forward whether the next backward
    communicates, so the forwards must be inside no_sync() too."""
    ref = _reference(setup, steps=1)[0]
    ddp = DDP(_mlp(setup))
    ddp.register_comm_hook(None, default_hooks.allreduce_hook)  # DDP's all-reduces then go through dist.all_reduce
    timeline = Timeline()
    before = _weights(ddp.module)
    with record_collectives(timeline):
        step_fn(ddp, _DDPAdapter(ddp), _micro(ref["data"]), F.cross_entropy, torch.optim.SGD(ddp.parameters(), lr=LR))
    launches = len(timeline.collectives())
    _expect(launches == 1, f"with DDP, {launches} bucket all-reduces instead of 1: DDP arms its hooks during the "
                           "forward, so the first k - 1 forwards belong inside no_sync() as well as their backwards")
    _check_weights(ddp.module, before, ref, context=" (with DDP)")
    return _max_diff(_weights(ddp.module), ref["after"], _trainable(ddp.module))


CASES: dict[str, Callable[[dict], dict]] = {"naive": case_naive, "broadcast": case_broadcast, "overlap": case_overlap,
                                            "buckets": case_buckets, "no_sync": case_no_sync}


def run_case(step: str, ns: dict) -> dict:
    """``{"verdict": "ok" | message, "diffs": {...}}`` of one step; the student's NotImplementedError propagates."""
    try:
        return {"verdict": "ok", "diffs": CASES[step](ns)}
    except Bad as exc:
        return {"verdict": str(exc), "diffs": {}}
