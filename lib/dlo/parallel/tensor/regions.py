"""The sequence-parallel regions, SP's "f" and "g": an all-gather and a reduce-scatter along the sequence,
which the ``sequence_parallel=True`` layers use in place of TP's copy and all-reduce (:func:`sequence_regions`
plugs other implementations in)."""
from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

from dlo.parallel import comm
from dlo.parallel.comm import copy_to_region, reduce_from_region


SEQ_DIM = 1  # activations are [batch, seq, hidden]


def _divisible(what: str, n: int, tp: int, where: str) -> None:
    if n % tp:
        divisors = [d for d in range(1, n + 1) if n % d == 0 and d <= 64]
        raise ValueError(f"{where}: tp={tp} does not divide {what}={n}; choose tp among {divisors}")


def _mark(param: nn.Parameter, split_dim: int | None) -> nn.Parameter:
    param.tp_split_dim = split_dim  # where this slice sits in the full tensor (None: replicated)
    return param


class _GatherFromSequenceRegion(torch.autograd.Function):
    """Forward: all-gather along the sequence (this rank's ``seq/tp`` tokens -> all of them), before a
    column-parallel layer. Backward: every rank's gradient of the whole sequence is a partial sum (its
    slice of the weights): sum them and keep this rank's tokens, a reduce-scatter."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return comm.all_gather_along(x, group, dim=SEQ_DIM, phase="forward")

    @staticmethod
    def backward(ctx, grad):
        return comm.reduce_scatter_along(grad, ctx.group, dim=SEQ_DIM, phase="backward"), None


class _ReduceScatterToSequenceRegion(torch.autograd.Function):
    """Forward: sum the partial outputs of a row-parallel layer and keep this rank's tokens (reduce-scatter
    along the sequence). Backward: each rank holds the gradient of its tokens; every partial output (whole
    sequence) needs all of them: all-gather along the sequence."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return comm.reduce_scatter_along(x, group, dim=SEQ_DIM, phase="forward")

    @staticmethod
    def backward(ctx, grad):
        return comm.all_gather_along(grad, ctx.group, dim=SEQ_DIM, phase="backward"), None


def gather_from_sequence_region(x: torch.Tensor, group=None) -> torch.Tensor:
    """SP's "f": all-gather along the sequence forward, reduce-scatter along the sequence backward."""
    return _GatherFromSequenceRegion.apply(x, group)


def reduce_scatter_to_sequence_region(x: torch.Tensor, group=None) -> torch.Tensor:
    """SP's "g": reduce-scatter along the sequence forward, all-gather along the sequence backward."""
    return _ReduceScatterToSequenceRegion.apply(x, group)


_REGIONS: dict[str, Any] = {"gather": gather_from_sequence_region, "reduce_scatter": reduce_scatter_to_sequence_region}


@contextlib.contextmanager
def sequence_regions(gather=None, reduce_scatter=None):
    """Inside the block, the ``sequence_parallel=True`` layers use these two functions ``(x, group) -> tensor``
    as their sequence all-gather and reduce-scatter regions (the workshop's balise 12 plugs its own in);
    ``None`` keeps the library's."""
    saved = dict(_REGIONS)
    _REGIONS.update({k: v for k, v in (("gather", gather), ("reduce_scatter", reduce_scatter)) if v is not None})
    try:
        yield
    finally:
        _REGIONS.clear()
        _REGIONS.update(saved)


def _enter(x: torch.Tensor, group, sequence_parallel: bool) -> torch.Tensor:
    """What comes before a column-parallel layer: f (TP) or the sequence all-gather (SP)."""
    return _REGIONS["gather"](x, group) if sequence_parallel else copy_to_region(x, group)


def _leave(x: torch.Tensor, group, sequence_parallel: bool) -> torch.Tensor:
    """What comes after a row-parallel layer: g (TP) or the sequence reduce-scatter (SP)."""
    return _REGIONS["reduce_scatter"](x, group) if sequence_parallel else reduce_from_region(x, group)
