"""Steps 1 and 2: the naive all-reduce after backward, and the broadcast of rank 0's state (played first as if
this rank received, so that a broadcast called on some ranks only is reported instead of hanging)."""
from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from dlo.parallel.dp_events import Timeline, record_collectives
from dlo.course.dp_scratch_cases.common import (
    Bad, LR, SETUPS, Setup, _check_weights, _diagnose, _expect, _frozen_error, _grads, _in, _loss_backward, _mlp,
    _reference, _weights, _world,
)


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
    if not any(counts):  # sent another way (dist.broadcast_object_list, ...): judged by what every rank ends with
        _real_broadcast(broadcast_state, setup, rank, " (dist.broadcast was never called: every parameter and buffer "
                                                      "must come from rank 0)")
        return
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
    _real_broadcast(broadcast_state, setup, rank)


def _real_broadcast(broadcast_state: Callable, setup: Setup, rank: int, why: str = "") -> None:
    """``broadcast_state`` with real communication: every rank must end with rank 0's parameters and buffers. The
    ranks agree on the verdict (rank 0 always holds its own state), so that all of them stop at the same check."""
    model = _broadcast_model(setup, rank)
    reference = _broadcast_model(setup, 0)
    with _RecordedBroadcasts(receive=False).active():
        broadcast_state(model)
    wrong = next((name for (name, got), want in zip(model.state_dict().items(), reference.state_dict().values())
                  if not torch.equal(got, want)), None)
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, wrong)
    for r, name in enumerate(everyone):
        _expect(name is None, f"after the broadcasts, {name} differs from rank 0's on rank {r}{why}")
