"""The tensor-parallel layers of a Llama: column- and row-parallel linears, the vocabulary-parallel embedding and
cross-entropy, SwiGLU, attention, the decoder block and :class:`TPLlama`, built by slicing a single-process model."""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from dlo.models.llama import Attention, Llama, SwiGLU, apply_rotary, causal_attention, lm_loss, rotary_cos_sin
from dlo.parallel import comm
from dlo.parallel.comm import gather_from_region, group_rank, group_size, reduce_from_region
from dlo.parallel.tensor.regions import _divisible, _enter, _leave, _mark


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
