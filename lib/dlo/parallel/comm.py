"""Autograd-aware collectives of Megatron-style tensor parallelism, each one counted.

Tensor parallelism splits every weight matrix over the ``tp`` ranks of a process group. Activations then
have to be combined at a few places, and the combination must also be right *backwards*. Four
primitives cover every case (Megatron-LM names them ``f``, ``g``, gather and scatter):

=====================  ==========================  ==============================
primitive              forward                     backward
=====================  ==========================  ==============================
:func:`copy_to_region` identity ("f")              all-reduce of the gradient
:func:`reduce_from_region` all-reduce ("g")        identity
:func:`gather_from_region` all-gather, last dim    keep this rank's slice
:func:`scatter_to_region`  keep this rank's slice  all-gather, last dim
=====================  ==========================  ==============================

``f`` and ``g`` are conjugate: where the forward copies a tensor to every rank, the backward must sum the
ranks' gradients of it, and vice versa.

Sequence parallelism (:mod:`dlo.parallel.tensor`, ``sequence_parallel=True``) replaces ``f`` by an all-gather
along the sequence (:func:`all_gather_along`) and ``g`` by a reduce-scatter along the sequence
(:func:`reduce_scatter_along`): sum over the ranks, keep this rank's contiguous chunk of the sequence.

Every collective that really runs (group of more than one process) is counted in a per-process
:data:`COUNTER`, by operation and by phase (forward / backward / anything the caller names), with the
bytes of its result on one rank (a reduce-scatter: the bytes of its *input*, the full tensor it sums, so that a
reduce-scatter plus an all-gather of one tensor count twice the bytes of one all-reduce of it: a ring all-reduce
is exactly those two steps, and moves the same data). A notebook reads it to compare "communication per step"
with theory::

    from dlo.parallel import comm
    comm.COUNTER.reset()
    loss = model.loss(x, y); loss.backward()
    comm.COUNTER.summary()   # {('all_reduce', 'forward'): {'calls': 5, 'bytes': ...}, ...}

With no process group (plain ``python``) or a group of one process, every primitive is the identity and
nothing is counted: the same model code runs unchanged on one process.
"""
from __future__ import annotations

import threading
from collections import defaultdict
from typing import Any

import torch
import torch.distributed as dist

# ----------------------------------------------------------------------------------------------------
# The counter
# ----------------------------------------------------------------------------------------------------


class CommCounter:
    """Calls and bytes of the collectives run by this process, by ``(op, phase)``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # autograd may run backward on another thread
        self._counts: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])

    def add(self, op: str, phase: str, nbytes: int) -> None:
        with self._lock:
            entry = self._counts[(op, phase)]
            entry[0] += 1
            entry[1] += int(nbytes)

    def reset(self) -> None:
        with self._lock:
            self._counts.clear()

    def summary(self) -> dict[tuple[str, str], dict[str, int]]:
        with self._lock:
            return {k: {"calls": v[0], "bytes": v[1]} for k, v in sorted(self._counts.items())}

    def rows(self) -> list[dict[str, Any]]:
        """The counts as a list of ``{"op", "phase", "calls", "bytes"}`` (JSON- and DataFrame-friendly)."""
        return [{"op": op, "phase": phase, **v} for (op, phase), v in self.summary().items()]

    def calls(self, op: str | None = None, phase: str | None = None) -> int:
        return sum(v["calls"] for (o, p), v in self.summary().items()
                   if (op is None or o == op) and (phase is None or p == phase))

    def bytes(self, op: str | None = None, phase: str | None = None) -> int:
        return sum(v["bytes"] for (o, p), v in self.summary().items()
                   if (op is None or o == op) and (phase is None or p == phase))


COUNTER = CommCounter()
"""This process's counter (one per process: every rank counts its own collectives)."""


# ----------------------------------------------------------------------------------------------------
# Groups
# ----------------------------------------------------------------------------------------------------

def group_size(group=None) -> int:
    """Processes in ``group`` (default: all); 1 when there is no process group at all."""
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size(group)


def group_rank(group=None) -> int:
    """This process's rank *inside* ``group`` (0..size-1); 0 when there is no process group."""
    if not (dist.is_available() and dist.is_initialized()):
        return 0
    return dist.get_rank(group)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


# ----------------------------------------------------------------------------------------------------
# Plain (non-autograd) counted collectives: the building blocks of the primitives below
# ----------------------------------------------------------------------------------------------------

def all_reduce(x: torch.Tensor, group=None, *, phase: str = "forward", op=None) -> torch.Tensor:
    """Sum (or ``op``: ``dist.ReduceOp.MAX``...) of ``x`` over the ranks of ``group``, counted under ``phase``.

    Returns a new tensor (the input is left alone, autograd may still need it).
    """
    if group_size(group) == 1:
        return x
    out = x.contiguous().clone()
    dist.all_reduce(out, op=op if op is not None else dist.ReduceOp.SUM, group=group)
    name = "all_reduce" if op is None or op == dist.ReduceOp.SUM else f"all_reduce_{str(op).split('.')[-1].lower()}"
    COUNTER.add(name, phase, _nbytes(out))
    return out


def all_gather_last_dim(x: torch.Tensor, group=None, *, phase: str = "forward") -> torch.Tensor:
    """The ranks' ``x`` concatenated along the last dimension, in rank order."""
    n = group_size(group)
    if n == 1:
        return x
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(n)]
    dist.all_gather(parts, x, group=group)
    out = torch.cat(parts, dim=-1)
    COUNTER.add("all_gather", phase, _nbytes(out))
    return out


def all_gather_along(x: torch.Tensor, group=None, *, dim: int = 1, phase: str = "forward") -> torch.Tensor:
    """The ranks' ``x`` concatenated along ``dim`` (the sequence, by default), in rank order; counted as
    ``all_gather`` with the bytes of the result."""
    n = group_size(group)
    if n == 1:
        return x
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(n)]
    dist.all_gather(parts, x, group=group)
    out = torch.cat(parts, dim=dim)
    COUNTER.add("all_gather", phase, _nbytes(out))
    return out


def _check_split(x: torch.Tensor, n: int, dim: int) -> None:
    if x.shape[dim] % n:
        raise ValueError(f"cannot split dimension {dim} of size {x.shape[dim]} over {n} ranks: make it a multiple "
                         f"of {n} (sequence parallelism needs seq_len divisible by tp)")


def reduce_scatter_along(x: torch.Tensor, group=None, *, dim: int = 1, phase: str = "forward") -> torch.Tensor:
    """The sum of ``x`` over the ranks of ``group``, of which this rank keeps chunk ``r`` of ``n`` along ``dim``
    (contiguous chunks, rank order: the inverse of :func:`all_gather_along`). Counted as ``reduce_scatter``
    with the bytes of its input (the full tensor). ValueError when ``n`` does not divide ``x.shape[dim]``."""
    n = group_size(group)
    if n == 1:
        return x
    _check_split(x, n, dim)
    full = x.movedim(dim, 0).contiguous()  # chunks along dim 0 are what reduce_scatter_tensor hands out
    out = torch.empty((full.shape[0] // n, *full.shape[1:]), dtype=x.dtype, device=x.device)
    dist.reduce_scatter_tensor(out, full, op=dist.ReduceOp.SUM, group=group)
    COUNTER.add("reduce_scatter", phase, _nbytes(x))
    return out.movedim(0, dim).contiguous()


def split_along(x: torch.Tensor, group=None, *, dim: int = 1) -> torch.Tensor:
    """This rank's contiguous chunk of ``dim`` (no communication); ValueError when the group size does not
    divide it."""
    n = group_size(group)
    if n == 1:
        return x
    _check_split(x, n, dim)
    size = x.shape[dim] // n
    return x.narrow(dim, group_rank(group) * size, size).contiguous()


def split_last_dim(x: torch.Tensor, group=None) -> torch.Tensor:
    """This rank's slice of the last dimension (no communication)."""
    n = group_size(group)
    if n == 1:
        return x
    if x.shape[-1] % n:
        raise ValueError(f"cannot split a last dimension of {x.shape[-1]} over {n} ranks: make it a multiple of {n}")
    size = x.shape[-1] // n
    r = group_rank(group)
    return x[..., r * size:(r + 1) * size].contiguous()


# ----------------------------------------------------------------------------------------------------
# Autograd-aware primitives
# ----------------------------------------------------------------------------------------------------

class _CopyToRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return all_reduce(grad, ctx.group, phase="backward"), None


class _ReduceFromRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        return all_reduce(x, group, phase="forward")

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _GatherFromRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return all_gather_last_dim(x, group, phase="forward")

    @staticmethod
    def backward(ctx, grad):
        return split_last_dim(grad, ctx.group), None


class _ScatterToRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return split_last_dim(x, group)

    @staticmethod
    def backward(ctx, grad):
        return all_gather_last_dim(grad, ctx.group, phase="backward"), None


def copy_to_region(x: torch.Tensor, group=None) -> torch.Tensor:
    """"f": identity forward, all-reduce of the gradient backward (before a column-parallel layer)."""
    return _CopyToRegion.apply(x, group)


def reduce_from_region(x: torch.Tensor, group=None) -> torch.Tensor:
    """"g": all-reduce forward, identity backward (after a row-parallel layer)."""
    return _ReduceFromRegion.apply(x, group)


def gather_from_region(x: torch.Tensor, group=None) -> torch.Tensor:
    """All-gather along the last dimension forward; backward keeps this rank's slice of the gradient."""
    return _GatherFromRegion.apply(x, group)


def scatter_to_region(x: torch.Tensor, group=None) -> torch.Tensor:
    """Keep this rank's slice of the last dimension forward; all-gather the gradient backward."""
    return _ScatterToRegion.apply(x, group)


__all__ = ["COUNTER", "CommCounter", "group_size", "group_rank", "all_reduce", "all_gather_last_dim",
           "all_gather_along", "reduce_scatter_along", "split_along", "split_last_dim", "copy_to_region",
           "reduce_from_region", "gather_from_region", "scatter_to_region"]
