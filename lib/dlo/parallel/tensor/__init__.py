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

**Sequence parallelism** (Korthikanti et al., 2022; ``sequence_parallel=True`` on the layers, the block and
:class:`TPLlama`): between a row-parallel layer and the next column-parallel one, plain TP keeps the whole
``[batch, seq, hidden]`` activation on every rank and computes the same RMSNorm and residual add ``tp`` times.
SP cuts those regions along the sequence: each rank holds ``seq/tp`` tokens there. The all-reduce "g" after
a row-parallel layer becomes a reduce-scatter along the sequence (:func:`reduce_scatter_to_sequence_region`),
the "f" before a column-parallel layer an all-gather along the sequence
(:func:`gather_from_sequence_region`); the embedding's all-reduce becomes a reduce-scatter and the LM head
gathers the sequence first. Same bytes on the wire (an all-reduce *is* a reduce-scatter then an all-gather),
``1/tp`` of the norms' activations per rank. The norms' weights are replicated but each rank now sees only
its tokens: their gradients are partial sums, added over the group by :func:`reduce_sequence_parallel_grads`
after the backward (what Megatron-LM does for its sequence-parallel parameters).
"""
from __future__ import annotations

import contextlib
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

SEQ_DIM = 1  # activations are [batch, seq, hidden]


def _divisible(what: str, n: int, tp: int, where: str) -> None:
    if n % tp:
        divisors = [d for d in range(1, n + 1) if n % d == 0 and d <= 64]
        raise ValueError(f"{where}: tp={tp} does not divide {what}={n}; choose tp among {divisors}")


def _mark(param: nn.Parameter, split_dim: int | None) -> nn.Parameter:
    param.tp_split_dim = split_dim  # where this slice sits in the full tensor (None: replicated)
    return param


# ----------------------------------------------------------------------------------------------------
# Sequence-parallel regions: the f and g of sequence parallelism
# ----------------------------------------------------------------------------------------------------

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


# ----------------------------------------------------------------------------------------------------
# Layers
# ----------------------------------------------------------------------------------------------------

class ColumnParallelLinear(nn.Module):
    """``y = x W^T + b`` with the **output** features split: this rank holds rows
    ``[r*out/tp, (r+1)*out/tp)`` of ``W`` (and of ``b``), sliced from ``full``.

    ``copy_input``: apply "f" to the input (set False when the caller already did, e.g. once for Q, K and V).
    ``gather_output``: all-gather the output slices (otherwise each rank returns its slice).
    ``sequence_parallel``: the input is this rank's chunk of the sequence; "f" becomes the all-gather along
    the sequence (:func:`gather_from_sequence_region`).
    """

    def __init__(self, full: nn.Linear, group=None, *, gather_output: bool = False, copy_input: bool = True,
                 sequence_parallel: bool = False) -> None:
        super().__init__()
        tp, r = group_size(group), group_rank(group)
        _divisible("out_features", full.out_features, tp, "ColumnParallelLinear")
        n = full.out_features // tp
        self.group, self.gather_output, self.copy_input = group, gather_output, copy_input
        self.sequence_parallel = sequence_parallel
        self.in_features, self.out_features = full.in_features, n
        self.weight = _mark(nn.Parameter(full.weight.detach()[r * n:(r + 1) * n].clone()), 0)
        self.bias = None if full.bias is None else _mark(nn.Parameter(full.bias.detach()[r * n:(r + 1) * n].clone()), 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.copy_input:
            x = _enter(x, self.group, self.sequence_parallel)
        y = F.linear(x, self.weight, self.bias)
        return gather_from_region(y, self.group) if self.gather_output else y


class RowParallelLinear(nn.Module):
    """``y = x W^T + b`` with the **input** features split: this rank holds columns
    ``[r*in/tp, (r+1)*in/tp)`` of ``W`` and receives the matching slice of ``x`` (``input_is_parallel``;
    otherwise it cuts its slice itself). Partial products are summed by "g"; ``b`` is added once, after.
    ``sequence_parallel``: "g" becomes the reduce-scatter along the sequence (each rank gets its tokens)."""

    def __init__(self, full: nn.Linear, group=None, *, input_is_parallel: bool = True,
                 sequence_parallel: bool = False) -> None:
        super().__init__()
        tp, r = group_size(group), group_rank(group)
        _divisible("in_features", full.in_features, tp, "RowParallelLinear")
        n = full.in_features // tp
        self.group, self.input_is_parallel, self.sequence_parallel = group, input_is_parallel, sequence_parallel
        self.in_features, self.out_features = n, full.out_features
        self.weight = _mark(nn.Parameter(full.weight.detach()[:, r * n:(r + 1) * n].clone()), 1)
        self.bias = None if full.bias is None else _mark(nn.Parameter(full.bias.detach().clone()), None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.input_is_parallel:
            x = comm.scatter_to_region(x, self.group)
        y = _leave(F.linear(x, self.weight), self.group, self.sequence_parallel)
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(nn.Module):
    """Embedding table split by vocabulary rows: this rank looks up the ids in its range, writes zeros for
    the others, and an all-reduce ("g") sums the ranks' answers (exactly one is non-zero per token).
    ``sequence_parallel``: a reduce-scatter along the sequence instead, so that each rank gets its tokens only."""

    def __init__(self, full: nn.Embedding, group=None, *, sequence_parallel: bool = False) -> None:
        super().__init__()
        tp, r = group_size(group), group_rank(group)
        _divisible("vocab_size", full.num_embeddings, tp, "VocabParallelEmbedding")
        n = full.num_embeddings // tp
        self.group, self.vocab_start, self.vocab_end = group, r * n, (r + 1) * n
        self.sequence_parallel = sequence_parallel
        self.num_embeddings, self.embedding_dim = n, full.embedding_dim
        self.weight = _mark(nn.Parameter(full.weight.detach()[r * n:(r + 1) * n].clone()), 0)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        outside = (ids < self.vocab_start) | (ids >= self.vocab_end)
        local = (ids - self.vocab_start).masked_fill(outside, 0)
        out = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        return _leave(out, self.group, self.sequence_parallel)


class ParallelSwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))`` with gate/up column-parallel and down row-parallel: the
    element-wise product needs no communication, so the whole MLP costs one all-reduce forward (g)
    and one backward (f). ``sequence_parallel``: the input is this rank's tokens, all-gathered along the
    sequence on the way in, and the output reduce-scattered along the sequence on the way out."""

    def __init__(self, full: SwiGLU, group=None, *, sequence_parallel: bool = False) -> None:
        super().__init__()
        _divisible("intermediate_size", full.gate_proj.out_features, group_size(group), "ParallelSwiGLU")
        self.group, self.sequence_parallel = group, sequence_parallel
        self.gate_proj = ColumnParallelLinear(full.gate_proj, group, copy_input=False)
        self.up_proj = ColumnParallelLinear(full.up_proj, group, copy_input=False)
        self.down_proj = RowParallelLinear(full.down_proj, group, sequence_parallel=sequence_parallel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _enter(x, self.group, self.sequence_parallel)  # once for gate and up: one collective of the gradient
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class ParallelAttention(nn.Module):
    """Grouped-query attention with the heads split: this rank owns query heads
    ``[r*h/tp, (r+1)*h/tp)`` and K/V heads ``[r*kv/tp, (r+1)*kv/tp)``; query head ``i`` still meets K/V head
    ``i // (h/kv)`` (contiguous blocks keep the groups together). Attention itself is local; ``o_proj`` is
    row-parallel: one all-reduce per forward. ``sequence_parallel``: all-gather the sequence on the way in,
    reduce-scatter it on the way out (``cos``/``sin`` are for the whole sequence)."""

    def __init__(self, full: Attention, group=None, *, sequence_parallel: bool = False) -> None:
        super().__init__()
        tp = group_size(group)
        _divisible("num_heads", full.num_heads, tp, "ParallelAttention")
        _divisible("num_kv_heads", full.num_kv_heads, tp, "ParallelAttention")
        self.group, self.head_dim, self.sequence_parallel = group, full.head_dim, sequence_parallel
        self.num_heads, self.num_kv_heads = full.num_heads // tp, full.num_kv_heads // tp
        self.q_proj = ColumnParallelLinear(full.q_proj, group, copy_input=False)
        self.k_proj = ColumnParallelLinear(full.k_proj, group, copy_input=False)
        self.v_proj = ColumnParallelLinear(full.v_proj, group, copy_input=False)
        self.o_proj = RowParallelLinear(full.o_proj, group, sequence_parallel=sequence_parallel)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = _enter(x, self.group, self.sequence_parallel)
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, k, cos, sin)
        out = causal_attention(q, k, v)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, self.num_heads * self.head_dim))


def _replicated(module: nn.Module, sequence_parallel: bool = False) -> nn.Module:
    out = copy.deepcopy(module)
    for p in out.parameters():
        _mark(p, None)
        p.sequence_parallel = sequence_parallel  # its gradient is a partial sum over the group (its tokens only)
    return out


class TPDecoderBlock(nn.Module):
    """The pre-norm block of :class:`dlo.models.llama.DecoderBlock` with parallel attention and MLP; the norms
    are replicated (their inputs are full on every rank, their gradients too, thanks to "f").

    ``sequence_parallel``: the block takes and returns this rank's ``seq/tp`` tokens; the norms and the residual
    adds run on them only (their weights' gradients then need :func:`reduce_sequence_parallel_grads`)."""

    def __init__(self, full: nn.Module, group=None, *, sequence_parallel: bool = False) -> None:
        super().__init__()
        self.sequence_parallel = sequence_parallel
        self.input_layernorm = _replicated(full.input_layernorm, sequence_parallel)
        self.self_attn = ParallelAttention(full.self_attn, group, sequence_parallel=sequence_parallel)
        self.post_attention_layernorm = _replicated(full.post_attention_layernorm, sequence_parallel)
        self.mlp = ParallelSwiGLU(full.mlp, group, sequence_parallel=sequence_parallel)

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
    the vocab-parallel cross-entropy (``vocab_parallel=False``: gathered logits + ``F.cross_entropy``).

    ``sequence_parallel=True``: the embedding reduce-scatters its output along the sequence, the blocks run
    their norms and residual adds on this rank's ``seq/tp`` tokens, the final norm too, and the LM head
    all-gathers the sequence before its column-parallel product (the logits stay split over the vocabulary).
    The sequence length must be a multiple of tp. After ``backward`` call
    :func:`reduce_sequence_parallel_grads` (the norms' gradients are partial sums)."""

    def __init__(self, full: Llama, group=None, *, sequence_parallel: bool = False) -> None:
        super().__init__()
        cfg, tp = full.cfg, group_size(group)
        for what, n in (("num_heads", cfg.num_heads), ("num_kv_heads", cfg.num_kv_heads),
                        ("vocab_size", cfg.vocab_size), ("intermediate_size", cfg.intermediate_size)):
            _divisible(what, n, tp, "TPLlama")
        self.cfg, self.group, self.rope_theta = cfg, group, full.rope_theta
        self.sequence_parallel = sequence_parallel
        sp = {"sequence_parallel": sequence_parallel}
        self.embed_tokens = VocabParallelEmbedding(full.embed_tokens, group, **sp)
        self.layers = nn.ModuleList(TPDecoderBlock(b, group, **sp) for b in full.layers)
        self.norm = _replicated(full.norm, sequence_parallel)
        self.lm_head = ColumnParallelLinear(full.lm_head, group, **sp)  # output stays split over the vocabulary
        if cfg.tie_embeddings:  # same vocabulary slice on both sides
            self.lm_head.weight = self.embed_tokens.weight

    def local_logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """This rank's slice ``[batch, seq, vocab/tp]`` of the logits."""
        seq, tp = input_ids.shape[1], group_size(self.group)
        if self.sequence_parallel and seq % tp:
            raise ValueError(f"sequence parallelism: tp={tp} does not divide seq_len={seq}; use a sequence length "
                             f"that is a multiple of {tp}, or sequence_parallel=False")
        x = self.embed_tokens(input_ids)
        cos, sin = rotary_cos_sin(seq, self.cfg.head_dim, theta=self.rope_theta, device=x.device, dtype=x.dtype)
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


# ----------------------------------------------------------------------------------------------------
# Activation memory of the regions sequence parallelism splits
# ----------------------------------------------------------------------------------------------------

def saved_bytes_inside(modules, fn) -> dict[str, Any]:
    """Run ``fn()`` and count the tensors autograd saves for the backward *while one of* ``modules`` *runs its
    forward* (``saved_tensors_hooks``), each storage once (two views of one tensor are one allocation),
    parameters left out (they are not activations). Returns ``{"bytes", "tensors": [(shape, bytes), ...],
    "out"}`` (``out``: what ``fn`` returned, so that its backward can still run).

    With the norms of a :class:`TPLlama` as ``modules``, this is the activation memory of the regions that
    sequence parallelism splits (the residual adds save nothing; the residual stream is the norms' input)."""
    modules = list(modules)
    params = {p.untyped_storage().data_ptr() for m in modules for p in m.parameters()}
    depth, seen, saved = [0], set(), []

    def enter(module, args):
        depth[0] += 1

    def leave(module, args, out):
        depth[0] -= 1

    def pack(t: torch.Tensor) -> torch.Tensor:
        if depth[0] > 0:
            ptr = t.untyped_storage().data_ptr()
            if ptr not in seen and ptr not in params:
                seen.add(ptr)
                saved.append((tuple(t.shape), t.untyped_storage().nbytes()))
        return t

    handles = [h for m in modules for h in (m.register_forward_pre_hook(enter), m.register_forward_hook(leave))]
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = fn()
    finally:
        for h in handles:
            h.remove()
    return {"bytes": sum(b for _, b in saved), "tensors": saved, "out": out}


def norm_saved_bytes_theory(num_layers: int, batch: int, seq: int, hidden: int, tp: int = 1, *,
                            sequence_parallel: bool = False, element_size: int = 4) -> int:
    """What the ``2L + 1`` RMSNorms of a :class:`TPLlama` save for the backward on one rank, for activations of
    ``element_size`` bytes: per norm its input converted to float32 (``x.float()``: ``x`` itself in float32, a copy
    in 16 bits), the float32 ``rsqrt(mean x² + eps)`` (one number per token) and the normalised ``x`` back in
    the activations' dtype (what the weight multiplies): ``batch · tokens · (hidden · (4 + element_size) + 4)``
    bytes, where ``tokens`` is the whole sequence with plain TP and ``seq / tp`` with sequence parallelism."""
    tokens = seq // tp if sequence_parallel else seq
    per_norm = batch * tokens * (hidden * (4 + element_size) + 4)
    return (2 * num_layers + 1) * per_norm


def _kib(n: float) -> str:
    return f"{n / 2**10:,.1f} KiB"


def sp_memory_sentence(tp: int, tp_bytes: int, sp_bytes: int, formula_sp_bytes: int | None = None) -> str:
    """One sentence on the norms' saved bytes of one rank, plain TP against SP, written from the measured numbers
    (and the formula's, when given)."""
    head = (f"At tp={tp}, the norms of one rank keep {_kib(sp_bytes)} for the backward with sequence parallelism "
            f"against {_kib(tp_bytes)} with plain TP")
    if sp_bytes >= tp_bytes:
        return f"{head}: no saving."
    if sp_bytes * tp == tp_bytes:
        how = f"exactly 1/{tp}"
    else:
        how = f"{tp_bytes / sp_bytes:.2f}x less, not the {tp}x that splitting the sequence in {tp} would give"
    if formula_sp_bytes is not None:
        how += (", the formula's number to the byte" if formula_sp_bytes == sp_bytes
                else f" (the formula says {_kib(formula_sp_bytes)})")
    return f"{head}: {how}."


def sp_comm_sentence(tp: int, tp_rows: list[dict[str, Any]], sp_rows: list[dict[str, Any]]) -> str:
    """One sentence on the collectives of one step, plain TP against SP (rows of ``COUNTER.rows()``, phases
    forward and backward), written from the counts: the loss's all-reduces are in both and cancel out."""
    def total(rows, op, what):
        return sum(r[what] for r in rows if r["op"] == op and r["phase"] in ("forward", "backward"))

    ar_calls = total(tp_rows, "all_reduce", "calls") - total(sp_rows, "all_reduce", "calls")
    ar_bytes = total(tp_rows, "all_reduce", "bytes") - total(sp_rows, "all_reduce", "bytes")
    rs, ag = total(sp_rows, "reduce_scatter", "calls"), total(sp_rows, "all_gather", "calls")
    sp_bytes = total(sp_rows, "reduce_scatter", "bytes") + total(sp_rows, "all_gather", "bytes")
    sp_ar = total(sp_rows, "all_reduce", "calls")
    head = (f"At tp={tp}, one step of plain TP ran {ar_calls} all-reduces of activations ({ar_bytes / 2**20:.2f} MiB); "
            f"sequence parallelism ran {rs} reduce-scatters and {ag} all-gathers instead "
            f"({sp_bytes / 2**20:.2f} MiB, each counted as the full tensor)")
    extra = "" if sp_ar == total(tp_rows, "all_reduce", "calls") - ar_calls else "; some all-reduces remained"
    if ar_bytes and sp_bytes == 2 * ar_bytes:
        return (f"{head}: exactly twice, that is the same traffic, since a ring all-reduce is a reduce-scatter "
                f"followed by an all-gather{extra}.")
    ratio = sp_bytes / ar_bytes if ar_bytes else float("inf")
    return f"{head}: {ratio:.2f}x the all-reduced bytes, not the 2x of the same traffic{extra}."


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

def dtensor_llama(full: Llama, mesh, *, sequence_parallel: bool = False) -> nn.Module:
    """A copy of ``full`` parallelised over the 1-D device ``mesh`` with ``parallelize_module``:
    Q/K/V, gate, up and the LM head column-wise; O and down row-wise; the embedding row-wise (its rows
    are the vocabulary). The LM head output is gathered (``Replicate``), so ``model(ids)`` gives the full
    logits and ``model.loss`` works unchanged. Heads must divide like :class:`TPLlama`'s.

    Tied embeddings (``cfg.tie_embeddings``, as in Llama 3.2) stay tied: ``parallelize_module`` gives each
    module its own new sharded parameter, which would silently untie the LM head from the embedding (two
    tensors, two half gradients). Both are sharded the same way (rows = vocabulary, ``Shard(0)``), so the
    head takes the embedding's sharded weight back: one parameter, whose gradient sums both uses.

    ``sequence_parallel``: the plan of :class:`TPLlama`'s ``sequence_parallel=True`` written with DTensor's
    styles: the embedding and the row-parallel layers output ``Shard(1)`` (a reduce-scatter along the
    sequence), ``SequenceParallel()`` on the norms, ``PrepareModuleInput`` gathering the sequence
    (``Shard(1)`` -> ``Replicate()``) in front of attention and the MLP, and the LM head takes ``Shard(1)``."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)

    tp, cfg = mesh.size(), full.cfg
    for what, n in (("num_heads", cfg.num_heads), ("num_kv_heads", cfg.num_kv_heads),
                    ("vocab_size", cfg.vocab_size), ("intermediate_size", cfg.intermediate_size)):
        _divisible(what, n, tp, "dtensor_llama")
    model = copy.deepcopy(full)
    seq = {"output_layouts": Shard(1)} if sequence_parallel else {}
    plan: dict[str, Any] = {
        "embed_tokens": RowwiseParallel(input_layouts=Replicate(), **seq),
        "lm_head": ColwiseParallel(output_layouts=Replicate(), **({"input_layouts": Shard(1)} if seq else {})),
    }
    if sequence_parallel:
        plan["norm"] = SequenceParallel()
    for i in range(len(model.layers)):
        for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"):
            plan[f"layers.{i}.{name}"] = ColwiseParallel()
        for name in ("self_attn.o_proj", "mlp.down_proj"):
            plan[f"layers.{i}.{name}"] = RowwiseParallel(**seq)
        if sequence_parallel:
            for name in ("input_layernorm", "post_attention_layernorm"):
                plan[f"layers.{i}.{name}"] = SequenceParallel()
            plan[f"layers.{i}.self_attn"] = PrepareModuleInput(input_layouts=(Shard(1), None, None),
                                                               desired_input_layouts=(Replicate(), None, None))
            plan[f"layers.{i}.mlp"] = PrepareModuleInput(input_layouts=(Shard(1),),
                                                         desired_input_layouts=(Replicate(),))
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


__all__ = ["gather_from_sequence_region", "reduce_scatter_to_sequence_region", "reduce_sequence_parallel_grads",
           "sequence_regions",
           "saved_bytes_inside", "norm_saved_bytes_theory", "sp_memory_sentence", "sp_comm_sentence",
           "ColumnParallelLinear", "RowParallelLinear",
           "VocabParallelEmbedding", "ParallelSwiGLU",
           "ParallelAttention", "TPDecoderBlock", "TPLlama", "vocab_parallel_cross_entropy", "gather_split",
           "full_tensors", "comm_theory", "tp_group_ranks", "dp_group_ranks", "tp_dp_groups",
           "all_reduce_gradients", "dtensor_llama", "dtensor_full_tensors"]
