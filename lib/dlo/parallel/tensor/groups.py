"""The process groups of TP x DP (contiguous ranks form a TP group, strided ranks a DP group), and the gradient
average over a DP group."""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from dlo.runtime.grid import Grid
from dlo.parallel import comm
from dlo.parallel.comm import group_rank, group_size


def tp_group_ranks(world_size: int, tp: int) -> list[list[int]]:
    """Contiguous blocks of ``tp`` ranks: ``[[0..tp-1], [tp..2tp-1], ...]`` (on a node, TP stays on NVLink)."""
    if tp < 1 or world_size % tp:
        raise ValueError(f"tp={tp} must divide the world size {world_size}")
    return Grid(world_size, dp=world_size // tp, tp=tp).groups("tp")


def dp_group_ranks(world_size: int, tp: int, dp: int | None = None) -> list[list[int]]:
    """Strided ranks: the ranks holding the *same* TP slice, ``[[0, tp, 2tp...], [1, tp+1, ...], ...]``."""
    dp = world_size // tp if dp is None else dp
    if tp * dp != world_size:
        raise ValueError(f"tp × dp must equal the world size: {tp} × {dp} = {tp * dp} ≠ {world_size}; "
                         f"launch {tp * dp} processes or change tp/dp")
    return Grid(world_size, dp=dp, tp=tp).groups("dp")


def tp_dp_groups(tp: int, dp: int | None = None) -> dict[str, Any]:
    """Create every TP and DP group (``dist.new_group`` must be called by *all* ranks for *every* group, in
    the same order) and return this rank's: ``{"tp_group", "dp_group", "tp_rank", "dp_rank", "tp", "dp"}``."""
    world, rank = group_size(None), group_rank(None)
    dp = world // tp if dp is None else dp
    dp_group_ranks(world, tp, dp)  # the clear error when tp × dp is not the world size
    grid = Grid(world, dp=dp, tp=tp)
    where = grid.coords(rank)
    out: dict[str, Any] = {"tp": tp, "dp": dp, "tp_rank": where["tp"], "dp_rank": where["dp"]}
    if not dist.is_initialized():
        return {**out, "tp_group": None, "dp_group": None}
    groups = grid.new_groups(rank, axes=("tp", "dp"))
    return {**out, "tp_group": groups["tp"], "dp_group": groups["dp"]}


def all_reduce_gradients(model: nn.Module, group=None) -> None:
    """Average every gradient over ``group`` (the DP group): one flat all-reduce, counted as phase "dp"."""
    n = group_size(group)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if n == 1 or not grads:
        return
    flat = comm.all_reduce(torch.cat([g.reshape(-1) for g in grads]), group, phase="dp") / n
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()
