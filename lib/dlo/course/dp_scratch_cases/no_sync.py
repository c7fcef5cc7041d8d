"""Step 5: gradient accumulation that communicates only on the last micro-batch, with the student's ``no_sync`` and
with DDP's."""
from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from dlo.parallel.dp_events import Timeline, record_collectives
from dlo.course.dp_scratch_cases.common import (
    Bad, LR, SETUPS, Setup, _check_weights, _expect, _in, _max_diff, _mlp, _reference, _trainable, _weights,
    _world,
)


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


def _micro(data, k: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(data[0][i::k], data[1][i::k]) for i in range(k)]


def _check_loss(returned: Any, ref: dict, K: int) -> None:  # noqa: N803 - k, the micro-batches per step
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
    K = setup.k  # noqa: N806 - the micro-batches per step, as in the exercise
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
            returned = step_fn(model, sync, _micro(ref[step]["data"], K), F.cross_entropy, opt)
        _expect(sync.require_sync is True, "no_sync() must set require_sync back when its block ends (try/finally): "
                                           "otherwise no later backward communicates")
        calls = timeline.collectives()
        count = len(calls)
        _expect(count != K * n or K == 1,
                f"{count} all-reduces for {K} micro-batches: it communicated on every micro-batch; "
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
                               "(the optimizer must step after sync.finish())"}, k=K)
        _check_loss(returned, ref[step], K)
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
        step_fn(ddp, _DDPAdapter(ddp), _micro(ref["data"], setup.k), F.cross_entropy,
                torch.optim.SGD(ddp.parameters(), lr=LR))
    launches = len(timeline.collectives())
    _expect(launches == 1, f"with DDP, {launches} bucket all-reduces instead of 1: DDP arms its hooks during the "
                           "forward, so the first k - 1 forwards belong inside no_sync() as well as their backwards")
    _check_weights(ddp.module, before, ref, context=" (with DDP)")
    return _max_diff(_weights(ddp.module), ref["after"], _trainable(ddp.module))
