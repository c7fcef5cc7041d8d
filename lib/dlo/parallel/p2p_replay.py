"""Replay a pipeline schedule's point-to-point transfers under NCCL's rules: find deadlocks without GPUs.

On a GPU cluster the pipeline's activations travel with NCCL, whose rules for large messages (beyond its
internal buffer, a few MiB) are stricter than gloo's:

1. between two ranks, in each direction, the n-th send meets the n-th receive: **tags are ignored**, so
   both ranks must post the same tensors in the same order (or the receiver silently gets the wrong one);
2. a send does not complete before its receive is posted, and a receive not before its send;
3. transfers posted together (one ``batch_isend_irecv``, a **batch**) complete as a whole: the rank waits
   until every transfer of the batch has met its partner before it goes on.

A rank posting ``send to 1`` alone while rank 1 posts ``send to 0`` alone waits forever (each send waits
for a receive the other rank has not reached); the same two transfers in one batch with their receives
complete. Whether a schedule can deadlock is therefore a property of each rank's **ordered list of
batches**, not of timing, and it can be decided here, on one CPU, by playing the lists:

* :func:`record` runs a real schedule function (``dlo.parallel.pipeline``'s or yours) for every rank of
  a ``p``-stage pipeline on a :class:`DryRunPipe`: the :class:`~dlo.parallel.pipeline.Pipe`'s own logic
  decides what is asked for and what is posted together, but nothing is sent and nothing is computed;
  it returns each rank's :class:`P2POp` list in posting order;
* :func:`replay` plays those lists under the three rules and returns a :class:`Replay`: success, or the
  deadlock with the transfers each rank is blocked on, and any send/receive pair that NCCL would match
  although they carry different tensors.

``record(..., one_at_a_time=True)`` reproduces how the Pipe posted its transfers before it batched them
(each one alone, as soon as the schedule asked for it): 1F1B then deadlocks as soon as it has a steady
state. Gloo is more lenient (small messages are buffered, tags are honoured), which is why the CPU tests
passed with that order.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch

from dlo.parallel.pipeline import SCHEDULES, Pipe, Transfer, train_step


@dataclasses.dataclass(frozen=True)
class P2POp:
    """One transfer of one rank: ``kind`` "send" or "recv", ``peer`` the other rank, ``batch`` the number of
    the batch it was posted in (ops of one rank with the same number were posted together), ``tag`` which
    tensor it carries (a send and the receive NCCL pairs it with must carry the same), ``what`` in words."""

    kind: str
    peer: int
    batch: int
    tag: int = 0
    what: str = ""

    def __str__(self) -> str:
        arrow = "to" if self.kind == "send" else "from"
        return f"{self.kind} {arrow} rank {self.peer}" + (f" ({self.what})" if self.what else "")


@dataclasses.dataclass
class Replay:
    """What :func:`replay` found. ``ok``: every batch of every rank completed and every matched pair carries
    the same tensor. ``batches_done`` / ``batches``: per rank, how many completed / how many there are.
    ``blocked``: for each rank that could not finish, the ops of the batch it is stuck in that never met
    their partner. ``mismatched``: pairs NCCL would match although they carry different tensors."""

    batches_done: list[int]
    batches: list[int]
    blocked: dict[int, list[P2POp]]
    mismatched: list[str]

    @property
    def deadlock(self) -> bool:
        return bool(self.blocked)

    @property
    def ok(self) -> bool:
        return not self.blocked and not self.mismatched

    def explain(self) -> str:
        """Several lines in words: what each blocked rank waits for, and the mismatched pairs."""
        if self.ok:
            return f"no deadlock: {sum(self.batches)} batches over {len(self.batches)} ranks all complete"
        lines = []
        if self.blocked:
            lines.append("deadlock: no rank can go on")
            for rank, ops in sorted(self.blocked.items()):
                lines.append(f"  rank {rank} is stuck in its batch {self.batches_done[rank] + 1} of "
                             f"{self.batches[rank]}, waiting on: " + "; ".join(map(str, ops)))
        lines += [f"  mismatch: {m}" for m in self.mismatched]
        return "\n".join(lines)


def replay(ops_per_rank: Sequence[Sequence[P2POp]]) -> Replay:
    """Play each rank's ordered transfers under NCCL's rules (see the module's docstring)."""
    n = len(ops_per_rank)
    # each rank's batches, in posting order: consecutive ops with the same batch number
    batches: list[list[list[P2POp]]] = []
    for ops in ops_per_rank:
        mine: list[list[P2POp]] = []
        for op in ops:
            if mine and mine[-1][0].batch == op.batch:
                mine[-1].append(op)
            else:
                mine.append([op])
        batches.append(mine)
    # rule 1: per ordered pair of ranks, the n-th send meets the n-th receive
    sends: dict[tuple[int, int], list[tuple[int, int, P2POp]]] = {}
    recvs: dict[tuple[int, int], list[tuple[int, int, P2POp]]] = {}
    for rank, mine in enumerate(batches):
        for b, ops in enumerate(mine):
            for op in ops:
                if not 0 <= op.peer < n or op.peer == rank:
                    raise ValueError(f"rank {rank}: {op} names no other rank of a world of {n}")
                if op.kind == "send":
                    sends.setdefault((rank, op.peer), []).append((rank, b, op))
                elif op.kind == "recv":
                    recvs.setdefault((op.peer, rank), []).append((rank, b, op))
                else:
                    raise ValueError(f"rank {rank}: transfer kind {op.kind!r}, expected 'send' or 'recv'")
    partner: dict[int, tuple[int, int]] = {}  # id(op) -> (rank, batch index) of the op it meets
    mismatched = []
    for pair in set(sends) | set(recvs):
        for (r1, b1, s), (r2, b2, r) in zip(sends.get(pair, []), recvs.get(pair, [])):
            partner[id(s)], partner[id(r)] = (r2, b2), (r1, b1)
            if s.tag != r.tag:
                mismatched.append(f"rank {r1}'s {s} meets rank {r2}'s {r}: the receiver gets the wrong tensor")
    # rules 2 and 3: a batch completes when each of its ops' partners is posted (in the partner rank's
    # current batch, or done); a rank waits for its current batch
    done = [0] * n
    progress = True
    while progress:
        progress = False
        for rank in range(n):
            while done[rank] < len(batches[rank]):
                ops = batches[rank][done[rank]]
                if not all(id(op) in partner and done[partner[id(op)][0]] >= partner[id(op)][1] for op in ops):
                    break
                done[rank] += 1
                progress = True
    blocked = {}
    for rank in range(n):
        if done[rank] < len(batches[rank]):
            ops = batches[rank][done[rank]]
            waiting = [op for op in ops if id(op) not in partner or done[partner[id(op)][0]] < partner[id(op)][1]]
            blocked[rank] = waiting
    return Replay(done, [len(b) for b in batches], blocked, sorted(mismatched))


# ----------------------------------------------------------------------------------------------------
# Recording a real schedule
# ----------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class _Slot:
    """What a Pipe needs to know about one of its stages to route transfers (no layers, no weights)."""

    index: int
    num_stages: int
    hidden_size: int = 1

    @property
    def is_first(self) -> bool:
        return self.index == 0

    @property
    def is_last(self) -> bool:
        return self.index == self.num_stages - 1


class DryRunPipe(Pipe):
    """The :class:`~dlo.parallel.pipeline.Pipe` of rank ``rank`` in a ``world_size``-stage pipeline with
    ``virtual`` chunks per rank, minus the model and the process group: the schedule's calls and the Pipe's
    decisions of what to post together are the real ones, but posting a batch only appends its ops to
    :attr:`log`, and the computes return zeros. ``one_at_a_time=True`` posts each transfer alone as soon as
    it is asked for (the Pipe's behaviour before it batched transfers)."""

    def __init__(self, rank: int, world_size: int, micro_batches: int, virtual: int = 1, *,
                 one_at_a_time: bool = False) -> None:
        self.log: list[P2POp] = []
        self.one_at_a_time = one_at_a_time
        slots = [_Slot(c * world_size + rank, world_size * virtual) for c in range(virtual)]
        ids = torch.zeros(micro_batches, 1, dtype=torch.long)
        super().__init__(slots, (ids, ids), micro_batches, rank=rank, world_size=world_size)

    def _collectives(self) -> bool:
        return False

    def _request(self, transfer: Transfer) -> None:
        super()._request(transfer)
        if self.one_at_a_time:
            self._flush()

    def _post(self, ops: list[Transfer]) -> list:
        self.log += [P2POp(op.kind, op.peer, self.batches_posted, op.tag, op.what) for op in ops]
        return []

    def _run_forward(self, stage, mb: int, x: torch.Tensor) -> tuple[torch.Tensor, int]:
        if stage.is_last:
            self.losses.append(0.0)
            return torch.zeros(()), 0
        return torch.zeros(self.act_shape), 0

    def _run_backward(self, stage, x, y, grad) -> torch.Tensor | None:
        return None if stage.is_first else torch.zeros(self.act_shape)


def record(schedule: str | Callable[[Pipe], None], num_stages: int, micro_batches: int, virtual: int = 1, *,
           one_at_a_time: bool = False) -> list[list[P2POp]]:
    """Each rank's transfers, in posting order, when ``schedule`` (a name of
    :data:`~dlo.parallel.pipeline.SCHEDULES` or a function of a Pipe) runs one step of a ``num_stages``-stage
    pipeline with ``micro_batches`` micro-batches and ``virtual`` chunks per rank."""
    fn = SCHEDULES.get(schedule) if isinstance(schedule, str) else schedule
    if fn is None:
        raise ValueError(f"unknown schedule {schedule!r}: choose one of {', '.join(SCHEDULES)}")
    out = []
    for rank in range(num_stages):
        pipe = DryRunPipe(rank, num_stages, micro_batches, virtual, one_at_a_time=one_at_a_time)
        train_step(pipe, fn)
        out.append(pipe.log)
    return out


def replay_schedule(schedule: str | Callable[[Pipe], None], num_stages: int, micro_batches: int, virtual: int = 1, *,
                    one_at_a_time: bool = False) -> Replay:
    """:func:`record` then :func:`replay`."""
    return replay(record(schedule, num_stages, micro_batches, virtual, one_at_a_time=one_at_a_time))


__all__ = ["P2POp", "Replay", "replay", "DryRunPipe", "record", "replay_schedule"]
