"""The cases of the ``experts dispatch`` checker, shared by the checker (in its own process) and its worker (on 2
processes). Kept out of :mod:`dlo.course.checks` so that a worker does not import every course's checkers.
"""
from __future__ import annotations

from typing import Callable

import torch


NUM_EXPERTS, HIDDEN = 4, 3

#: (where, rows of rank 0, rows of rank 1, the experts each rank's rows go to): 2 experts per rank
CASES = [
    ("uneven counts both ways", (5, 3), ((0, 1, 2, 3), (0, 2, 3))),
    ("rank 1 sends nothing", (6, 0), ((0, 1, 2, 3), ())),
    ("rank 1 receives nothing (every row goes to rank 0's experts)", (4, 3), ((0, 1), (0, 1))),
]


def expert_output(rows: torch.Tensor, global_expert: torch.Tensor) -> torch.Tensor:
    """What expert ``e`` makes of a row: a different affine map per expert (the checker's stand-in for an MLP)."""
    e = global_expert.to(rows.dtype).unsqueeze(-1)
    return rows * (e + 2) + 10 * e


def case_inputs(case: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows and experts of ``rank`` in case ``case`` (the same on every process: seeded)."""
    _, sizes, targets = CASES[case]
    g = torch.Generator().manual_seed(100 * case + rank)
    m, choices = sizes[rank], torch.tensor(targets[rank], dtype=torch.long)
    rows = torch.randn(m, HIDDEN, generator=g, dtype=torch.float64)
    expert = choices[torch.randint(len(choices), (m,), generator=g)] if m else torch.zeros(0, dtype=torch.long)
    if m >= len(choices):  # every target used at least once, the order shuffled (not grouped by expert)
        expert[: len(choices)] = choices
        expert = expert[torch.randperm(m, generator=g)]
    return rows, expert


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
                            f"rank's own experts, 0 to {self.per - 1} (global expert = rank · {self.per} + local)")
            return torch.zeros_like(received)
        return expert_output(received, local_expert + self.rank * self.per)


def verdict(dispatch_combine: Callable, rows: torch.Tensor, expert: torch.Tensor, rank: int, ep: int,
            where: str) -> str:
    """``"ok"`` or what is wrong, for one call on this rank (any world size)."""
    per = NUM_EXPERTS // ep
    local = LocalExperts(rank, per)
    want = expert_output(rows, expert)
    got = dispatch_combine(rows.clone(), expert.clone(), NUM_EXPERTS, local)
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
    if torch.allclose(got, expert_output(rows, expert % per + rank * per), rtol=1e-12, atol=1e-12) or \
            torch.allclose(got, expert_output(rows, expert % per), rtol=1e-12, atol=1e-12):
        return f"{where}: the rows were run by the wrong experts: each row must reach the rank that holds its " \
               "expert, and be given that expert's local id there"
    return f"{where}: the outputs differ from each row's expert output by " \
           f"{float((got - want).abs().max()):.3g} (a row sent to the wrong rank or expert, or back to the wrong place)"




class SplitMismatch(RuntimeError):
    """Two ranks disagree on the size of a slice of an all_to_all_single (raised on every rank alike)."""


def checked_all_to_all(real: Callable) -> Callable:
    """``torch.distributed.all_to_all_single`` that first compares, across the group, what each rank expects from
    each peer with what that peer sends, and raises :class:`SplitMismatch` on every rank when they differ (gloo
    would abort the process, NCCL would hang or corrupt). Used by the checker's processes only."""
    import torch.distributed as dist

    def call(output, input, output_split_sizes=None, input_split_sizes=None, group=None, async_op=False):
        ws, me = dist.get_world_size(group), dist.get_rank(group)
        out_sizes = list(output_split_sizes) if output_split_sizes is not None else [output.shape[0] // ws] * ws
        in_sizes = list(input_split_sizes) if input_split_sizes is not None else [input.shape[0] // ws] * ws
        mine = torch.tensor([out_sizes, in_sizes, [output.shape[0], input.shape[0]] + [0] * (ws - 2)],
                            dtype=torch.long)
        every = [torch.empty_like(mine) for _ in range(ws)]
        dist.all_gather(every, mine, group=group)
        for rank in range(ws):
            got, sent = every[rank][0], every[rank][1]
            if int(got.sum()) != int(every[rank][2][0]) or int(sent.sum()) != int(every[rank][2][1]):
                raise SplitMismatch(f"on rank {rank} the split sizes do not add up to the tensors' rows (input "
                                    f"{int(every[rank][2][1])} rows split {sent.tolist()}, output "
                                    f"{int(every[rank][2][0])} rows split {got.tolist()}): the way back swaps the two "
                                    "lists of sizes of the way out")
            for src in range(ws):
                if int(got[src]) != int(every[src][1][rank]):
                    raise SplitMismatch(f"rank {rank} expects {int(got[src])} rows from rank {src}, which sends it "
                                        f"{int(every[src][1][rank])}: the sizes to receive are the counts the peers "
                                        "send (exchange them first), and the way back swaps the two lists of sizes")
        return real(output, input, output_split_sizes, input_split_sizes, group=group, async_op=async_op)

    return call
