"""Megatron-style tensor parallelism of :class:`dlo.models.llama.Llama`, from scratch, plus DTensor's version.

Each rank of a tensor-parallel (TP) group of ``tp`` processes holds a *slice* of every big matrix:

* :class:`ColumnParallelLinear` splits the **output** features (rows of ``weight``): every rank needs the
  whole input (``copy_to_region`` "f" before it) and produces its slice of the output;
* :class:`RowParallelLinear` splits the **input** features (columns of ``weight``): it takes the slice a
  column-parallel layer produced and its partial outputs are summed over the ranks (``reduce_from_region``
  "g"); the bias is added once, after the sum;
* :class:`VocabParallelEmbedding` splits the vocabulary: ids outside a rank's range give zeros there, and
  an all-reduce sums the one non-zero row;
* :class:`ParallelSwiGLU` = gate/up column-parallel, down row-parallel: **one** all-reduce per forward;
* :class:`ParallelAttention` gives each rank ``heads/tp`` query heads and ``kv_heads/tp`` K/V heads (GQA
  keeps its grouping inside a rank): again one all-reduce per forward;
* :func:`vocab_parallel_cross_entropy` computes the loss from each rank's slice of the logits, without
  ever gathering the ``[tokens, vocab]`` matrix on one rank.

:class:`TPLlama` is built by *slicing the full weights* of a single-process ``Llama`` (so both start
identical and can be compared exactly) and keeps its parameter names; :func:`full_tensors` gathers its
slices (weights or gradients) back into full tensors. :func:`tp_dp_groups` builds the process groups of
TP × DP (contiguous ranks form a TP group, strided ranks a DP group). :func:`dtensor_llama` parallelises
the same model with ``torch.distributed.tensor.parallel.parallelize_module`` for comparison.
"""
from __future__ import annotations

import copy
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from dlo.runtime.grid import Grid
from dlo.models.llama import Attention, Llama, SwiGLU, apply_rotary, causal_attention, lm_loss, rotary_cos_sin
from dlo.parallel import comm
from dlo.parallel.comm import copy_to_region, gather_from_region, group_rank, group_size, reduce_from_region


def _divisible(what: str, n: int, tp: int, where: str) -> None:
    if n % tp:
        divisors = [d for d in range(1, n + 1) if n % d == 0 and d <= 64]
        raise ValueError(f"{where}: tp={tp} does not divide {what}={n}; choose tp among {divisors}")


def _mark(param: nn.Parameter, split_dim: int | None) -> nn.Parameter:
    param.tp_split_dim = split_dim  # where this slice sits in the full tensor (None: replicated)
    return param


# ----------------------------------------------------------------------------------------------------
# Layers
# ----------------------------------------------------------------------------------------------------

class ColumnParallelLinear(nn.Module):
    """``y = x W^T + b`` with the **output** features split: this rank holds rows
    ``[r*out/tp, (r+1)*out/tp)`` of ``W`` (and of ``b``), sliced from ``full``.

    ``copy_input``: apply "f" to the input (set False when the caller already did, e.g. once for Q, K and V).
    ``gather_output``: all-gather the output slices (otherwise each rank returns its slice).
    """

    def __init__(self, full: nn.Linear, group=None, *, gather_output: bool = False, copy_input: bool = True) -> None:
        super().__init__()
        tp, r = group_size(group), group_rank(group)
        _divisible("out_features", full.out_features, tp, "ColumnParallelLinear")
        n = full.out_features // tp
        self.group, self.gather_output, self.copy_input = group, gather_output, copy_input
        self.in_features, self.out_features = full.in_features, n
        self.weight = _mark(nn.Parameter(full.weight.detach()[r * n:(r + 1) * n].clone()), 0)
        self.bias = None if full.bias is None else _mark(nn.Parameter(full.bias.detach()[r * n:(r + 1) * n].clone()), 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.copy_input:
            x = copy_to_region(x, self.group)
        y = F.linear(x, self.weight, self.bias)
        return gather_from_region(y, self.group) if self.gather_output else y


class RowParallelLinear(nn.Module):
    """``y = x W^T + b`` with the **input** features split: this rank holds columns
    ``[r*in/tp, (r+1)*in/tp)`` of ``W`` and receives the matching slice of ``x`` (``input_is_parallel``;
    otherwise it cuts its slice itself). Partial products are summed by "g"; ``b`` is added once, after."""

    def __init__(self, full: nn.Linear, group=None, *, input_is_parallel: bool = True) -> None:
        super().__init__()
        tp, r = group_size(group), group_rank(group)
        _divisible("in_features", full.in_features, tp, "RowParallelLinear")
        n = full.in_features // tp
        self.group, self.input_is_parallel = group, input_is_parallel
        self.in_features, self.out_features = n, full.out_features
        self.weight = _mark(nn.Parameter(full.weight.detach()[:, r * n:(r + 1) * n].clone()), 1)
        self.bias = None if full.bias is None else _mark(nn.Parameter(full.bias.detach().clone()), None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.input_is_parallel:
            x = comm.scatter_to_region(x, self.group)
        y = reduce_from_region(F.linear(x, self.weight), self.group)
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(nn.Module):
    """Embedding table split by vocabulary rows: this rank looks up the ids in its range, writes zeros for
    the others, and an all-reduce ("g") sums the ranks' answers (exactly one is non-zero per token)."""

    def __init__(self, full: nn.Embedding, group=None) -> None:
        super().__init__()
        tp, r = group_size(group), group_rank(group)
        _divisible("vocab_size", full.num_embeddings, tp, "VocabParallelEmbedding")
        n = full.num_embeddings // tp
        self.group, self.vocab_start, self.vocab_end = group, r * n, (r + 1) * n
        self.num_embeddings, self.embedding_dim = n, full.embedding_dim
        self.weight = _mark(nn.Parameter(full.weight.detach()[r * n:(r + 1) * n].clone()), 0)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        outside = (ids < self.vocab_start) | (ids >= self.vocab_end)
        local = (ids - self.vocab_start).masked_fill(outside, 0)
        out = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        return reduce_from_region(out, self.group)


class ParallelSwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))`` with gate/up column-parallel and down row-parallel: the
    element-wise product needs no communication, so the whole MLP costs one all-reduce forward (g)
    and one backward (f)."""

    def __init__(self, full: SwiGLU, group=None) -> None:
        super().__init__()
        _divisible("intermediate_size", full.gate_proj.out_features, group_size(group), "ParallelSwiGLU")
        self.group = group
        self.gate_proj = ColumnParallelLinear(full.gate_proj, group, copy_input=False)
        self.up_proj = ColumnParallelLinear(full.up_proj, group, copy_input=False)
        self.down_proj = RowParallelLinear(full.down_proj, group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = copy_to_region(x, self.group)  # once for gate and up: one all-reduce of the gradient
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class ParallelAttention(nn.Module):
    """Grouped-query attention with the heads split: this rank owns query heads
    ``[r*h/tp, (r+1)*h/tp)`` and K/V heads ``[r*kv/tp, (r+1)*kv/tp)``; query head ``i`` still meets K/V head
    ``i // (h/kv)`` (contiguous blocks keep the groups together). Attention itself is local; ``o_proj`` is
    row-parallel: one all-reduce per forward."""

    def __init__(self, full: Attention, group=None) -> None:
        super().__init__()
        tp = group_size(group)
        _divisible("num_heads", full.num_heads, tp, "ParallelAttention")
        _divisible("num_kv_heads", full.num_kv_heads, tp, "ParallelAttention")
        self.group, self.head_dim = group, full.head_dim
        self.num_heads, self.num_kv_heads = full.num_heads // tp, full.num_kv_heads // tp
        self.q_proj = ColumnParallelLinear(full.q_proj, group, copy_input=False)
        self.k_proj = ColumnParallelLinear(full.k_proj, group, copy_input=False)
        self.v_proj = ColumnParallelLinear(full.v_proj, group, copy_input=False)
        self.o_proj = RowParallelLinear(full.o_proj, group)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        x = copy_to_region(x, self.group)
        q = self.q_proj(x).view(b, s, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, k, cos, sin)
        out = causal_attention(q, k, v)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, self.num_heads * self.head_dim))


def _replicated(module: nn.Module) -> nn.Module:
    out = copy.deepcopy(module)
    for p in out.parameters():
        _mark(p, None)
    return out


class TPDecoderBlock(nn.Module):
    """The pre-norm block of :class:`dlo.models.llama.DecoderBlock` with parallel attention and MLP; the norms
    are replicated (their inputs are full on every rank, their gradients too, thanks to "f")."""

    def __init__(self, full: nn.Module, group=None) -> None:
        super().__init__()
        self.input_layernorm = _replicated(full.input_layernorm)
        self.self_attn = ParallelAttention(full.self_attn, group)
        self.post_attention_layernorm = _replicated(full.post_attention_layernorm)
        self.mlp = ParallelSwiGLU(full.mlp, group)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


def vocab_parallel_cross_entropy(local_logits: torch.Tensor, labels: torch.Tensor, group=None, *,
                                 ignore_index: int = -100) -> torch.Tensor:
    """Mean cross-entropy from each rank's slice ``[..., vocab/tp]`` of the logits (rank ``r`` holds vocabulary
    ``[r*V/tp, (r+1)*V/tp)``), equal to ``F.cross_entropy`` of the full logits.

    ``log sum_v exp(z_v) = m + log sum_r sum_{v in r} exp(z_v - m)`` with ``m`` the global max (an all-reduce
    MAX of one number per token, no gradient needed); the target logit lives on one rank only: each rank
    contributes it or 0. The two per-token sums travel in one all-reduce ("g", so the backward is local).
    """
    tp, r = group_size(group), group_rank(group)
    z = local_logits.float()
    n = z.shape[-1]
    start = r * n
    m = comm.all_reduce(z.detach().amax(dim=-1), group, op=dist.ReduceOp.MAX if tp > 1 else None)
    z = z - m.unsqueeze(-1)
    inside = (labels >= start) & (labels < start + n)
    local = (labels - start).clamp(0, n - 1)
    target = z.gather(-1, local.unsqueeze(-1)).squeeze(-1) * inside
    sums = reduce_from_region(torch.stack((z.exp().sum(dim=-1), target)), group)
    per_token = sums[0].log() - sums[1]
    valid = labels != ignore_index
    return (per_token * valid).sum() / valid.sum().clamp(min=1)


class TPLlama(nn.Module):
    """:class:`dlo.models.llama.Llama` split over the ranks of ``group`` (all processes by default), sliced from the
    full model ``full`` (same parameter names). ``forward`` returns the gathered logits; :meth:`loss` uses
    the vocab-parallel cross-entropy (``vocab_parallel=False``: gathered logits + ``F.cross_entropy``)."""

    def __init__(self, full: Llama, group=None) -> None:
        super().__init__()
        cfg, tp = full.cfg, group_size(group)
        for what, n in (("num_heads", cfg.num_heads), ("num_kv_heads", cfg.num_kv_heads),
                        ("vocab_size", cfg.vocab_size), ("intermediate_size", cfg.intermediate_size)):
            _divisible(what, n, tp, "TPLlama")
        self.cfg, self.group, self.rope_theta = cfg, group, full.rope_theta
        self.embed_tokens = VocabParallelEmbedding(full.embed_tokens, group)
        self.layers = nn.ModuleList(TPDecoderBlock(b, group) for b in full.layers)
        self.norm = _replicated(full.norm)
        self.lm_head = ColumnParallelLinear(full.lm_head, group)  # output stays split over the vocabulary
        if cfg.tie_embeddings:  # same vocabulary slice on both sides
            self.lm_head.weight = self.embed_tokens.weight

    def local_logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """This rank's slice ``[batch, seq, vocab/tp]`` of the logits."""
        x = self.embed_tokens(input_ids)
        cos, sin = rotary_cos_sin(input_ids.shape[1], self.cfg.head_dim, theta=self.rope_theta,
                                  device=x.device, dtype=x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return gather_from_region(self.local_logits(input_ids), self.group)

    def loss(self, input_ids: torch.Tensor, labels: torch.Tensor, *, vocab_parallel: bool = True) -> torch.Tensor:
        if vocab_parallel:
            return vocab_parallel_cross_entropy(self.local_logits(input_ids), labels, self.group)
        return lm_loss(self(input_ids), labels)


# ----------------------------------------------------------------------------------------------------
# Gathering slices back; the communication theory
# ----------------------------------------------------------------------------------------------------

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


def comm_theory(num_layers: int, *, vocab_parallel_loss: bool = True) -> dict[tuple[str, str], int]:
    """Collectives of one training step of :class:`TPLlama` (tp > 1), by ``(op, phase)``.

    Forward: 2 all-reduces per layer (attention and MLP, "g"), 1 for the embedding; then either 2 small
    all-reduces per token for the vocab-parallel loss (max, and the two sums) or 1 all-gather of the logits.
    Backward: 2 per layer ("f" before attention and MLP) + 1 ("f" before the LM head).
    """
    out = {("all_reduce", "forward"): 2 * num_layers + 1, ("all_reduce", "backward"): 2 * num_layers + 1}
    if vocab_parallel_loss:
        out[("all_reduce", "forward")] += 1
        out[("all_reduce_max", "forward")] = 1
    else:
        out[("all_gather", "forward")] = 1
    return out


# ----------------------------------------------------------------------------------------------------
# Process groups for TP x DP
# ----------------------------------------------------------------------------------------------------

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


# ----------------------------------------------------------------------------------------------------
# DTensor: the same split, written by PyTorch
# ----------------------------------------------------------------------------------------------------

def dtensor_llama(full: Llama, mesh) -> nn.Module:
    """A copy of ``full`` parallelised over the 1-D device ``mesh`` with ``parallelize_module``:
    Q/K/V, gate, up and the LM head column-wise; O and down row-wise; the embedding row-wise (its rows
    are the vocabulary). The LM head output is gathered (``Replicate``), so ``model(ids)`` gives the full
    logits and ``model.loss`` works unchanged. Heads must divide like :class:`TPLlama`'s.

    Tied embeddings (``cfg.tie_embeddings``, as in Llama 3.2) stay tied: ``parallelize_module`` gives each
    module its own new sharded parameter, which would silently untie the LM head from the embedding (two
    tensors, two half gradients). Both are sharded the same way (rows = vocabulary, ``Shard(0)``), so the
    head takes the embedding's sharded weight back: one parameter, whose gradient sums both uses."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    tp, cfg = mesh.size(), full.cfg
    for what, n in (("num_heads", cfg.num_heads), ("num_kv_heads", cfg.num_kv_heads),
                    ("vocab_size", cfg.vocab_size), ("intermediate_size", cfg.intermediate_size)):
        _divisible(what, n, tp, "dtensor_llama")
    model = copy.deepcopy(full)
    plan: dict[str, Any] = {
        "embed_tokens": RowwiseParallel(input_layouts=Replicate()),
        "lm_head": ColwiseParallel(output_layouts=Replicate()),
    }
    for i in range(len(model.layers)):
        for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"):
            plan[f"layers.{i}.{name}"] = ColwiseParallel()
        for name in ("self_attn.o_proj", "mlp.down_proj"):
            plan[f"layers.{i}.{name}"] = RowwiseParallel()
    model = parallelize_module(model, mesh, plan)
    if cfg.tie_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    return model


def dtensor_full_tensors(model: nn.Module, *, grads: bool = False) -> dict[str, torch.Tensor]:
    """``{name: full tensor}`` of a :func:`dtensor_llama` model's parameters or gradients."""
    from torch.distributed.tensor import DTensor

    out = {}
    for name, p in model.named_parameters():
        t = p.grad if grads else p
        if t is None:
            raise ValueError(f"parameter {name} has no gradient: run backward first")
        out[name] = (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()
    return out


__all__ = ["ColumnParallelLinear", "RowParallelLinear", "VocabParallelEmbedding", "ParallelSwiGLU",
           "ParallelAttention", "TPDecoderBlock", "TPLlama", "vocab_parallel_cross_entropy", "gather_split",
           "full_tensors", "comm_theory", "tp_group_ranks", "dp_group_ranks", "tp_dp_groups",
           "all_reduce_gradients", "dtensor_llama", "dtensor_full_tensors"]
