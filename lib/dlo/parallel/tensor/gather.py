"""Gathering the slices back into full tensors (weights or gradients), the sequence-parallel norms' partial
gradients summed over the group, and the communication a TP step must show (:func:`comm_theory`)."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from dlo.parallel import comm
from dlo.parallel.comm import group_size


def gather_split(t: torch.Tensor, dim: int | None, group=None) -> torch.Tensor:
    """The full tensor of which every rank of ``group`` holds the slice ``t`` along ``dim`` (not counted)."""
    n = group_size(group)
    if dim is None or n == 1:
        return t.detach().clone()
    parts = [torch.empty_like(t) for _ in range(n)]
    dist.all_gather(parts, t.detach().contiguous(), group=group)
    return torch.cat(parts, dim=dim)


def full_tensors(model: nn.Module, group=None, *, grads: bool = False) -> dict[str, torch.Tensor]:
    """``{name: full tensor}`` of the parameters (``grads=True``: of their gradients) of a TP model, slices
    gathered over ``group``: comparable name by name with the single-process model's."""
    out = {}
    for name, p in model.named_parameters():
        t = p.grad if grads else p
        if t is None:
            raise ValueError(f"parameter {name} has no gradient: run backward first")
        out[name] = gather_split(t, getattr(p, "tp_split_dim", None), group)
    return out


def reduce_sequence_parallel_grads(model: nn.Module, group=None) -> None:
    """Sum over ``group`` the gradients of the parameters that saw only this rank's tokens (the norms of a
    ``sequence_parallel=True`` model): one flat all-reduce, counted as phase "sp_grads", after the backward
    and before any data-parallel averaging or optimizer step. Nothing to do without sequence parallelism."""
    grads = [p.grad for p in model.parameters() if getattr(p, "sequence_parallel", False) and p.grad is not None]
    if group_size(group) == 1 or not grads:
        return
    flat = comm.all_reduce(torch.cat([g.reshape(-1) for g in grads]), group, phase="sp_grads")
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def comm_theory(num_layers: int, *, vocab_parallel_loss: bool = True,
                sequence_parallel: bool = False) -> dict[tuple[str, str], int]:
    """Collectives of one training step of :class:`TPLlama` (tp > 1), by ``(op, phase)``.

    Forward: 2 all-reduces per layer (attention and MLP, "g"), 1 for the embedding; then either 2 small
    all-reduces per token for the vocab-parallel loss (max, and the two sums) or 1 all-gather of the logits.
    Backward: 2 per layer ("f" before attention and MLP) + 1 ("f" before the LM head).

    ``sequence_parallel``: each of those activation all-reduces becomes a reduce-scatter (the g's and the
    embedding's, forward) or an all-gather (the f's, forward) and its conjugate backward: ``2L + 1``
    reduce-scatters and ``2L + 1`` all-gathers each way, no activation all-reduce (the norms' gradients, one
    small all-reduce in phase "sp_grads" after the backward, are not in this count).
    """
    n = 2 * num_layers + 1
    if sequence_parallel:
        out = {(op, phase): n for op in ("reduce_scatter", "all_gather") for phase in ("forward", "backward")}
        if vocab_parallel_loss:
            out[("all_reduce", "forward")] = 1
            out[("all_reduce_max", "forward")] = 1
        else:
            out[("all_gather", "forward")] += 1
        return out
    out = {("all_reduce", "forward"): n, ("all_reduce", "backward"): n}
    if vocab_parallel_loss:
        out[("all_reduce", "forward")] += 1
        out[("all_reduce_max", "forward")] = 1
    else:
        out[("all_gather", "forward")] = 1
    return out
