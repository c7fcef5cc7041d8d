"""The cases of the ``experts dispatch`` checker, shared by the checker (in its own process) and its worker (on 3
processes). Kept out of :mod:`dlo.course.checks` so that a worker does not import every course's checkers.

A case is generated from a seed, over everything the answer's correctness depends on: the size of the group (2 and
3 ranks), the group itself (the default group of every process, or an explicit group that is not the world: a
strided one, ranks 0 and 2, and a subset, ranks 1 and 2, where a rank's place in the group differs from its global
rank), the experts per rank (1 to 4, so that ``rank · ep`` and ``rank · experts_per_rank`` differ), uneven counts,
a rank that sends nothing and a rank whose experts get no row. The cases are sorted smallest first, so that the
first one that fails is the smallest that shows the mistake.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

import torch


HIDDEN = 5  # not a number of experts or ranks of any case: a row exchange is told from a count exchange by it
WORLD = 3  # processes of the checker's launch


@dataclass(frozen=True)
class Case:
    """One call of ``dispatch_combine`` on every rank of a group."""

    members: tuple[int, ...] | None  # the global ranks of an explicit group; None: the default group (every process)
    per: int  # experts per rank
    rows: tuple[int, ...]  # rows of each group rank
    targets: tuple[tuple[int, ...], ...]  # the global experts each group rank's rows may go to
    seed: int

    @property
    def ep(self) -> int:
        return len(self.rows)

    @property
    def num_experts(self) -> int:
        return self.per * self.ep

    def describe(self) -> str:
        group = ("the default group of 3 processes" if self.members is None
                 else f"an explicit group of global ranks {list(self.members)}")
        idle = [r for r in range(self.ep) if not any(r * self.per <= e < (r + 1) * self.per
                                                      for t, m in zip(self.targets, self.rows) if m for e in t)]
        return (f"{group}, {self.per} expert{'s' if self.per > 1 else ''} per rank ({self.num_experts} experts), "
                f"rows per rank {list(self.rows)}" + (f", no row for rank {idle[0]}'s experts" if idle else ""))


def _case(rng: random.Random, members: tuple[int, ...] | None, per: int, seed: int, *, empty_sender: int | None,
          idle: int | None) -> Case:
    ep = WORLD if members is None else len(members)
    rows = tuple(0 if r == empty_sender else rng.randint(2, 7) for r in range(ep))
    experts = [e for e in range(per * ep) if idle is None or not idle * per <= e < (idle + 1) * per]
    targets = tuple(tuple(sorted(rng.sample(experts, min(len(experts), rng.randint(1, len(experts))))))
                    for _ in range(ep))
    return Case(members, per, rows, targets, seed)


def generate(seed: int = 0) -> list[Case]:
    """The fixed edge cases and the generated ones, smallest first (fewest ranks, then experts, then rows)."""
    rng = random.Random(seed)
    cases = [  # fixed: uneven counts both ways, a rank that sends nothing, one that receives nothing
        Case((0, 1), 2, (5, 3), ((0, 1, 2, 3), (0, 2, 3)), 1),
        Case((0, 1), 2, (6, 0), ((0, 1, 2, 3), ()), 2),
        Case((0, 1), 2, (4, 3), ((0, 1), (0, 1)), 3),
    ]
    groups = ((0, 2), (1, 2), None)  # strided, a subset, the world
    for members in groups:
        ep = WORLD if members is None else len(members)
        for per in range(1, (4 if ep == 2 else 3) + 1):
            i = len(cases)
            cases.append(_case(rng, members, per, 100 + i, empty_sender=(i % (ep + 1)) if i % 2 else None,
                               idle=(i // 2) % (ep + 1) if (i // 2) % (ep + 1) < ep else None))
    return sorted(cases, key=lambda c: (c.ep, c.num_experts, sum(c.rows), c.seed))


CASES = generate()


def case_inputs(case: Case, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows and global experts of group rank ``rank`` in ``case`` (the same on every process: seeded)."""
    g = torch.Generator().manual_seed(case.seed * 10 + rank)
    m, choices = case.rows[rank], torch.tensor(case.targets[rank], dtype=torch.long)
    rows = torch.randn(m, HIDDEN, generator=g, dtype=torch.float64)
    if not m:
        return rows, torch.zeros(0, dtype=torch.long)
    expert = choices[torch.randint(len(choices), (m,), generator=g)]
    if m >= len(choices):  # every target used at least once, the order shuffled (not grouped by expert)
        expert[: len(choices)] = choices
        expert = expert[torch.randperm(m, generator=g)]
    return rows, expert


def split_sizes(case: Case, rank: int) -> tuple[list[int], list[int]]:
    """What group rank ``rank`` sends to each rank of the group, and receives from each, on the way out."""
    def sends(r: int) -> list[int]:
        owner = case_inputs(case, r)[1] // case.per
        return torch.bincount(owner, minlength=case.ep).tolist()
    every = [sends(r) for r in range(case.ep)]
    return every[rank], [every[src][rank] for src in range(case.ep)]


def expert_output(rows: torch.Tensor, global_expert: torch.Tensor) -> torch.Tensor:
    """What expert ``e`` makes of a row: a different affine map per expert (the checker's stand-in for an MLP)."""
    e = global_expert.to(rows.dtype).unsqueeze(-1)
    return rows * (e + 2) + 10 * e


class LocalExperts:
    """The ``run_local`` given to the student's function on ``rank``: records what it receives."""

    def __init__(self, rank: int, per: int) -> None:
        self.rank, self.per, self.calls, self.received = rank, per, 0, 0
        self.problem: str | None = None

    def __call__(self, received: torch.Tensor, local_expert: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        self.received += int(received.shape[0])
        if local_expert.numel() and (int(local_expert.min()) < 0 or int(local_expert.max()) >= self.per):
            # noted, not raised: the exchanges that follow must still happen on every rank
            self.problem = (f"run_local got local expert ids {sorted(set(local_expert.tolist()))}: they number this "
                            f"rank's own experts, 0 to {self.per - 1} (global expert = rank in the group · "
                            f"{self.per} experts per rank + local)")
            return torch.zeros_like(received)
        return expert_output(received, local_expert + self.rank * self.per)


def verdict(dispatch_combine: Callable, rows: torch.Tensor, expert: torch.Tensor, rank: int, ep: int,
            where: str, num_experts: int, group: object = None) -> str:
    """``"ok"`` or what is wrong, for one call on group rank ``rank`` of a group of ``ep`` ranks."""
    per = num_experts // ep
    local = LocalExperts(rank, per)
    want = expert_output(rows, expert)
    args = (rows.clone(), expert.clone(), num_experts, local)
    got = dispatch_combine(*args) if group is None else dispatch_combine(*args, group=group)
    if local.problem:
        return f"{where}: {local.problem}"
    if local.calls != 1:
        return f"{where}: run_local was called {local.calls} times on this rank: once, on every row it received"
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(rows.shape):
        return f"{where}: return one output row per row, {tuple(rows.shape)}, got " \
               f"{tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__}"
    if torch.allclose(got, want, rtol=1e-12, atol=1e-12):
        return "ok"
    order = torch.argsort(expert, stable=True)
    if torch.allclose(got, want[order], rtol=1e-12, atol=1e-12):
        return f"{where}: the outputs come back sorted by expert, the order they were sent in: put each back at its " \
               "row's place (the inverse of the sort)"
    bad = int((~torch.isclose(got, want, rtol=1e-12, atol=1e-12).all(-1)).nonzero()[0, 0])
    what = ""
    for e in range(num_experts):
        if e != int(expert[bad]) and torch.allclose(got[bad], expert_output(rows[bad], torch.tensor(e)), rtol=1e-12,
                                                    atol=1e-12):
            what = f" (expert {e}'s output for it)"
    for j in range(rows.shape[0]):
        if j != bad and torch.allclose(got[bad], want[j], rtol=1e-12, atol=1e-12):
            what = f" (row {j}'s output)"
    return (f"{where}: on rank {rank} of the group, row {bad} (for expert {int(expert[bad])}) came back as "
            f"{[round(v, 3) for v in got[bad].tolist()[:2]]}...{what}, expected "
            f"{[round(v, 3) for v in want[bad].tolist()[:2]]}... (max difference {float((got - want).abs().max()):.3g}): "
            "a row was sent to the wrong rank or expert, or came back to the wrong place")


class SplitMismatch(RuntimeError):
    """The split sizes of an all_to_all_single are not the ones the case needs (raised on every rank alike)."""


class CheckedAllToAll:
    """``torch.distributed.all_to_all_single`` that first gathers, across the group, the split sizes of every rank
    and compares them with the case's (:func:`split_sizes`), and raises :class:`SplitMismatch` on every rank alike
    when they differ (gloo would abort the process, NCCL would hang or corrupt). Used by the checker's processes
    only; :meth:`start` is called before each case with the group and the sizes expected on this rank."""

    def __init__(self, real: Callable) -> None:
        self.real, self.group, self.expected, self.row_calls = real, None, None, 0

    def start(self, group: object, expected: tuple[list[int], list[int]]) -> None:
        self.group, self.expected, self.row_calls = group, expected, 0

    def __call__(self, output, input, output_split_sizes=None, input_split_sizes=None, group=None, async_op=False):
        import torch.distributed as dist

        if group is not self.group and not (self.group is None and group is dist.group.WORLD):
            given = "the default group (every process)" if group in (None, dist.group.WORLD) else "another group"
            raise SplitMismatch(f"all_to_all_single ran on {given}, not on the group given to dispatch_combine: "
                                "pass group=group to every collective")
        ws = dist.get_world_size(group)
        rows = input.is_floating_point() and tuple(input.shape[1:]) == (HIDDEN,)
        self.row_calls += rows
        out_sizes = list(output_split_sizes) if output_split_sizes is not None else [output.shape[0] // ws] * ws
        in_sizes = list(input_split_sizes) if input_split_sizes is not None else [input.shape[0] // ws] * ws
        width = max(ws, 6)
        pad = lambda v: (list(v) + [0] * width)[:width]  # noqa: E731
        send, recv = self.expected
        mine = torch.tensor([pad(out_sizes), pad(in_sizes), pad(send), pad(recv),
                             pad([len(out_sizes), len(in_sizes), output.shape[0], input.shape[0], int(rows),
                                  self.row_calls])], dtype=torch.long)
        every = [torch.empty_like(mine) for _ in range(ws)]
        dist.all_gather(every, mine, group=group)
        problem = _split_problem(every, ws)
        if problem:
            raise SplitMismatch(problem)
        return self.real(output, input, output_split_sizes, input_split_sizes, group=group, async_op=async_op)


def _split_problem(every: list[torch.Tensor], ws: int) -> str | None:
    """What is wrong with the split sizes gathered from every rank (the same answer on every rank), or None."""
    for rank in range(ws):
        got, sent, send, recv, meta = (t.tolist() for t in every[rank])
        if meta[0] != ws or meta[1] != ws:
            return (f"rank {rank} of the group gave split sizes for {max(meta[0], meta[1])} ranks, the group given "
                    f"has {ws}: the sizes, ranks and experts per rank are those of the group given to "
                    "dispatch_combine")
        got, sent, send, recv = got[:ws], sent[:ws], send[:ws], recv[:ws]
        if meta[4]:  # an exchange of rows: the way out sends `send` and receives `recv`, the way back the reverse
            way_out = meta[5] == 1
            want_in, want_out = (send, recv) if way_out else (recv, send)
            if (sent, got) == (want_in, want_out):
                continue
            if way_out and sent != send:
                return (f"on the way out, rank {rank} of the group cuts its rows as {sent} for ranks "
                        f"0..{ws - 1}, but its rows' experts are held by those ranks as {send} (expert e is on rank "
                        "e // experts per rank)")
            if way_out:
                return (f"on the way out, rank {rank} of the group expects {got} rows from ranks 0..{ws - 1}, "
                        f"which send it {recv}: the sizes to receive are the counts each peer sends")
            if (sent, got) == (send, recv):
                return (f"on the way back, rank {rank} of the group sends {sent} and expects {got}, the sizes of the "
                        f"way out: it must return to each peer what it received from it ({recv}) and get back what "
                        f"it sent ({send}): the way back swaps the two lists of sizes")
            return (f"on the way back, rank {rank} of the group sends {sent} and expects {got}; expected to send "
                    f"{recv} (what it received) and to get back {send} (what it sent)")
        if sum(got) != meta[2] or sum(sent) != meta[3]:
            return (f"on rank {rank} of the group the split sizes do not add up to the tensors' rows (input {meta[3]} rows split "
                    f"{sent}, output {meta[2]} rows split {got})")
        for src in range(ws):
            if got[src] != every[src][1].tolist()[rank]:
                return (f"rank {rank} of the group expects {got[src]} values from its rank {src}, which sends it "
                        f"{every[src][1].tolist()[rank]}")
    return None
