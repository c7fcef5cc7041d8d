"""Context parallelism from scratch: the sequence split over ``cp`` ranks, ring attention, the online-softmax merge.

A transformer's activations grow with the sequence length ``S``: every layer keeps ``[batch, S, hidden]``
tensors for the backward, and attention itself compares every query with every key. *Context parallelism*
(CP) gives each of ``cp`` ranks ``S / cp`` tokens of **every** sequence. Everything but attention is
token-wise and runs on the local tokens unchanged; attention needs the keys and values of the whole
sequence, so they travel around a **ring** (each rank passes its current K/V block to the next rank and
receives one from the previous), and each rank combines the ``cp`` partial attentions of its queries with
the **online-softmax** rule (:func:`merge_partial`), never holding more than two K/V blocks at a time.

**The merge.** Attention of queries over a key set ``A`` gives an output ``out_A`` (softmax-weighted mean of
the values) and ``lse_A = log Σ_{k∈A} exp(s_k)``, the log of the softmax's denominator. Over ``A ∪ B``::

    lse = log(exp(lse_A) + exp(lse_B))             (torch.logaddexp: no overflow)
    out = exp(lse_A - lse) · out_A + exp(lse_B - lse) · out_B

which is exact, associative and commutative: blocks can arrive in any order.

**Load balancing.** With causal attention, query ``i`` sees keys ``0..i``: a rank holding the *last* tokens
has far more work than the first. :func:`shard` with ``layout="balanced"`` cuts the sequence into ``2·cp``
chunks and gives rank ``r`` chunks ``r`` and ``2·cp-1-r`` (one early, one late): every rank then has exactly
the same number of unmasked query-key pairs (:func:`causal_work`). ``layout="contiguous"`` (chunk ``r`` to
rank ``r``) is the naive split, for comparison.

**Blocks.** Ring attention works chunk by chunk: a query chunk ``i`` against a key chunk ``j`` is *fully
visible* (``j < i``), *diagonal* (``j == i``: the causal mask inside), or *fully masked* (``j > i``:
skipped, no work).

**Communication.** Each ring step posts its send (to ``rank+1``) and its receive (from ``rank-1``) together,
with one ``torch.distributed.batch_isend_irecv``, before computing on the current block (the transfer
overlaps the compute). Posted one at a time, every rank's send would wait for a receive its neighbour has
not posted yet: under NCCL's rules for large messages the ring deadlocks (:func:`ring_p2p_ops`, replayed by
:mod:`dlo.parallel.p2p_replay`, shows it on one CPU; this module does not import it, which would load the
pipeline and model code into every ring process).

:func:`ring_attention` is differentiable: its backward runs a second ring in which each K/V block travels
with the gradients of its keys and values, accumulated by every rank it visits and back home at the end.
:func:`simulate_ring` runs the same blocks for all ranks in one process (no process group).
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

LAYOUTS = ("balanced", "contiguous")


# ----------------------------------------------------------------------------------------------------
# Sharding the sequence
# ----------------------------------------------------------------------------------------------------
def _check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}: choose 'balanced' or 'contiguous'")


def num_chunks(cp: int, layout: str = "balanced") -> int:
    """How many equal chunks the sequence is cut into: ``2·cp`` (balanced) or ``cp`` (contiguous)."""
    _check_layout(layout)
    if not isinstance(cp, int) or isinstance(cp, bool) or cp < 1:
        raise ValueError(f"cp must be a positive number of ranks, got {cp!r}")
    return 2 * cp if layout == "balanced" else cp


def rank_chunks(rank: int, cp: int, layout: str = "balanced") -> list[int]:
    """The chunks rank ``rank`` keeps, in sequence order: ``[rank, 2·cp-1-rank]`` (balanced) or ``[rank]``."""
    num_chunks(cp, layout)
    if not 0 <= rank < cp:
        raise ValueError(f"rank {rank} is not in a context-parallel group of {cp}")
    return [rank, 2 * cp - 1 - rank] if layout == "balanced" else [rank]


def chunk_len(seq_len: int, cp: int, layout: str = "balanced") -> int:
    n = num_chunks(cp, layout)
    if seq_len % n:
        raise ValueError(f"sequence length {seq_len} must be a multiple of {n} to be split into {n} equal chunks "
                         f"over cp={cp} ranks ({layout} layout)")
    return seq_len // n


def shard_positions(seq_len: int, cp: int, rank: int, layout: str = "balanced") -> torch.Tensor:
    """The token positions rank ``rank`` holds, increasing."""
    c = chunk_len(seq_len, cp, layout)
    return torch.cat([torch.arange(j * c, (j + 1) * c) for j in rank_chunks(rank, cp, layout)])


def shard(x: torch.Tensor, cp: int, rank: int, layout: str = "balanced", dim: int = -2) -> torch.Tensor:
    """Rank ``rank``'s part of ``x`` along the sequence dimension ``dim`` (``-2`` for ``[batch, heads, seq,
    head_dim]``), a new tensor."""
    return x.index_select(dim, shard_positions(x.shape[dim], cp, rank, layout).to(x.device))


def unshard(shards: list[torch.Tensor] | tuple[torch.Tensor, ...], layout: str = "balanced",
            dim: int = -2) -> torch.Tensor:
    """The inverse of :func:`shard`: the ``cp`` ranks' parts (rank order) put back into the whole sequence."""
    cp = len(shards)
    seq_len = sum(s.shape[dim] for s in shards)
    out = torch.empty_like(torch.cat(list(shards), dim))
    for rank, part in enumerate(shards):
        out.index_copy_(dim, shard_positions(seq_len, cp, rank, layout).to(out.device), part)
    return out


def causal_work(seq_len: int, cp: int, layout: str = "balanced") -> list[int]:
    """Per rank, the unmasked query-key pairs of causal attention (query at position ``i`` sees ``i + 1`` keys):
    the work each rank must do. Equal over the ranks with the balanced layout, growing with the rank with the
    contiguous one."""
    return [int((shard_positions(seq_len, cp, r, layout) + 1).sum()) for r in range(cp)]


# ----------------------------------------------------------------------------------------------------
# Attention of one block, and the merge
# ----------------------------------------------------------------------------------------------------
def merge_partial(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor,
                  lse_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention over keys ``A ∪ B`` from the attentions over ``A`` and over ``B``.

    ``out_*``: ``[..., seq, head_dim]``; ``lse_*``: ``[..., seq]``, the log-sum-exp of each query's scores.
    A part with ``lse = -inf`` (every key masked) leaves the other unchanged."""
    lse = torch.logaddexp(lse_a, lse_b)
    safe = torch.where(torch.isinf(lse) & (lse < 0), torch.zeros_like(lse), lse)  # both parts empty: 0, not NaN
    out = torch.exp(lse_a - safe).unsqueeze(-1) * out_a + torch.exp(lse_b - safe).unsqueeze(-1) * out_b
    return out, lse


def block_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, diagonal: bool = False,
                    scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, lse)`` of queries ``q [..., Lq, d]`` over keys/values ``k, v [..., Lk, d]``. ``diagonal``: the
    two blocks hold the same positions, query ``i`` sees keys ``0..i``."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale
    if diagonal:
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    return torch.exp(scores - lse.unsqueeze(-1)) @ v, lse


def block_kind(q_chunk: int, k_chunk: int, causal: bool = True) -> str:
    """``"full"`` (every key visible), ``"diagonal"`` (the causal mask inside) or ``"skip"`` (every key masked)."""
    if not causal or k_chunk < q_chunk:
        return "full"
    return "diagonal" if k_chunk == q_chunk else "skip"


def repeat_kv(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """K or V of ``[batch, kv_heads, seq, d]`` repeated to ``num_heads`` heads (query head ``h`` uses K/V head
    ``h // (num_heads / kv_heads)``, as in :class:`dlo.models.llama.Attention`)."""
    kv_heads = x.shape[-3]
    if num_heads % kv_heads:
        raise ValueError(f"num_heads={num_heads} must be a multiple of num_kv_heads={kv_heads}")
    return x if kv_heads == num_heads else x.repeat_interleave(num_heads // kv_heads, dim=-3)


def _sum_kv_heads(grad: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """The backward of :func:`repeat_kv`: sum the gradients of the query heads sharing a K/V head."""
    *lead, heads, seq, d = grad.shape
    if heads == kv_heads:
        return grad
    return grad.reshape(*lead, kv_heads, heads // kv_heads, seq, d).sum(-3)


class _Accumulator:
    """One rank's running ``(out, lse)`` per query chunk, and the counts of block kinds it met."""

    def __init__(self, q: torch.Tensor, q_chunks: list[int], causal: bool, stats: dict | None) -> None:
        self.c = q.shape[-2] // len(q_chunks)
        self.q, self.q_chunks, self.causal = q, q_chunks, causal
        self.parts: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(q_chunks)
        self.stats = stats

    def attend(self, k: torch.Tensor, v: torch.Tensor, k_chunks: list[int]) -> None:
        k, v = repeat_kv(k, self.q.shape[-3]), repeat_kv(v, self.q.shape[-3])
        for a, qa in enumerate(self.q_chunks):
            q = self.q[..., a * self.c:(a + 1) * self.c, :]
            for b, kb in enumerate(k_chunks):
                kind = block_kind(qa, kb, self.causal)
                if self.stats is not None:
                    self.stats[kind] = self.stats.get(kind, 0) + 1
                    self.stats["pairs"] = self.stats.get("pairs", 0) + (
                        0 if kind == "skip" else self.c * self.c if kind == "full" else self.c * (self.c + 1) // 2)
                if kind == "skip":
                    continue
                part = block_attention(q, k[..., b * self.c:(b + 1) * self.c, :],
                                       v[..., b * self.c:(b + 1) * self.c, :], diagonal=kind == "diagonal")
                self.parts[a] = part if self.parts[a] is None else merge_partial(*self.parts[a], *part)

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        if any(p is None for p in self.parts):  # cannot happen: every query chunk meets its own diagonal
            raise RuntimeError("a query chunk saw no key")
        return (torch.cat([p[0] for p in self.parts], -2), torch.cat([p[1] for p in self.parts], -1))


# ----------------------------------------------------------------------------------------------------
# Ring attention
# ----------------------------------------------------------------------------------------------------
def ring_source(rank: int, step: int, cp: int) -> int:
    """The rank whose K/V block ``rank`` holds at ring step ``step`` (0 .. cp-1): its own at step 0, then, as every
    rank passes its block to ``rank + 1`` after each step, the block of ``rank - step``."""
    return (rank - step) % cp


def ring_schedule(cp: int) -> list[list[tuple[str, int]]]:
    """What rank 0 posts at each ring step, as ``[(kind, peer offset)]``; every rank does the same relative to
    itself: steps ``0..cp-2`` each post one batch ``[send to rank+1, receive from rank-1]`` (the K/V block
    for the next step), the last step posts nothing."""
    return [[("send", +1), ("recv", -1)] if step < cp - 1 else [] for step in range(cp)]


class RingOp(NamedTuple):
    """One transfer, with the fields of :class:`dlo.parallel.p2p_replay.P2POp` in its order (``P2POp(*op)``)."""

    kind: str
    peer: int
    batch: int
    tag: int
    what: str


def ring_p2p_ops(cp: int, *, one_at_a_time: bool = False, backward: bool = False) -> list[list[RingOp]]:
    """Each rank's transfers of one ring attention, in posting order: ``[[P2POp(*op) for op in ops] for ops in
    ring_p2p_ops(cp)]`` is what :func:`dlo.parallel.p2p_replay.replay` takes. ``tag`` is the rank whose K/V
    block travels. ``one_at_a_time=True``: each transfer posted alone, the send
    first (the order that deadlocks). ``backward=True``: the backward's ring (K/V and their gradients go one
    more step, home)."""
    out = []
    for rank in range(cp):
        ops: list[RingOp] = []
        batch = 0
        steps = cp if backward else cp - 1
        for step in range(steps):
            owner = (rank - step) % cp  # the block this rank holds at this step, which it passes on
            recv_owner = (rank - 1 - step) % cp
            pair = [("send", (rank + 1) % cp, owner), ("recv", (rank - 1) % cp, recv_owner)]
            for i, (kind, peer, tag) in enumerate(pair):
                ops.append(RingOp(kind, peer, batch + (i if one_at_a_time else 0), tag, f"K/V of rank {tag}"))
            batch += 2 if one_at_a_time else 1
        out.append(ops)
    return out


def _group_info(group: Any) -> tuple[int, int]:
    if group is None and not (dist.is_available() and dist.is_initialized()):
        return 1, 0
    return dist.get_world_size(group), dist.get_rank(group)


def _peer(group: Any, group_rank: int) -> int:
    """The global rank of ``group_rank`` in ``group`` (what P2POp / isend / irecv take)."""
    return group_rank if group is None else dist.get_global_rank(group, group_rank)


class _Ring:
    """Passes a flat tensor to the next rank and receives the previous rank's, posted as one batch."""

    def __init__(self, group: Any) -> None:
        self.group = group
        self.cp, self.rank = _group_info(group)
        self.next, self.prev = _peer(group, (self.rank + 1) % self.cp), _peer(group, (self.rank - 1) % self.cp)
        self.batches = 0  # batches posted (each: one send and one receive)

    def start(self, send: torch.Tensor) -> tuple[torch.Tensor, list]:
        recv = torch.empty_like(send)
        ops = [dist.P2POp(dist.isend, send, self.next, self.group), dist.P2POp(dist.irecv, recv, self.prev, self.group)]
        self.batches += 1
        return recv, dist.batch_isend_irecv(ops)

    @staticmethod
    def wait(reqs: list) -> None:
        for r in reqs:
            r.wait()


def _pack(*ts: torch.Tensor) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in ts])


def _unpack(flat: torch.Tensor, like: list[torch.Tensor]) -> list[torch.Tensor]:
    out, i = [], 0
    for t in like:
        out.append(flat[i:i + t.numel()].view_as(t))
        i += t.numel()
    return out


def _ring_forward(q, k, v, group, causal, layout, stats):
    ring = _Ring(group)
    cp, rank = ring.cp, ring.rank
    acc = _Accumulator(q, rank_chunks(rank, cp, layout), causal, stats)
    kv = _pack(k, v)
    for step in range(cp):
        reqs, nxt = [], None
        if step < cp - 1:  # post the transfer of the next block, then compute on this one (overlap)
            nxt, reqs = ring.start(kv)
        kb, vb = _unpack(kv, [k, v])
        acc.attend(kb, vb, rank_chunks(ring_source(rank, step, cp), cp, layout))
        if nxt is not None:
            ring.wait(reqs)
            kv = nxt
    if stats is not None:
        stats["batches"] = stats.get("batches", 0) + ring.batches
    return acc.result()


def _block_backward(q, k, v, out, lse, dout, delta, diagonal, scale):
    """Gradients of one block, from the *global* lse of the queries (the softmax over all keys)."""
    scores = (q @ k.transpose(-2, -1)) * scale
    if diagonal:
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
    p = torch.exp(scores - lse.unsqueeze(-1))
    dv = p.transpose(-2, -1) @ dout
    dp = dout @ v.transpose(-2, -1)
    ds = p * (dp - delta.unsqueeze(-1)) * scale
    return ds @ k, ds.transpose(-2, -1) @ q, dv


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, group, causal, layout, stats):
        out, lse = _ring_forward(q, k, v, group, causal, layout, stats)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.causal, ctx.layout = group, causal, layout
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        ring = _Ring(ctx.group)
        cp, rank = ring.cp, ring.rank
        heads, kv_heads = q.shape[-3], k.shape[-3]
        scale = 1.0 / math.sqrt(q.shape[-1])
        dout = dout.contiguous()
        delta = (dout * out).sum(-1)  # rowsum(dO ∘ O): the softmax backward's correction
        if dlse is not None:  # lse is an output too: d lse / d s = p, folded into delta
            delta = delta - dlse
        q_chunks = rank_chunks(rank, cp, ctx.layout)
        c = q.shape[-2] // len(q_chunks)
        dq = torch.zeros_like(q)
        dk, dv = torch.zeros_like(k), torch.zeros_like(v)
        blk = _pack(k, v, dk, dv)
        for step in range(cp):
            kb, vb, dkb, dvb = (t.clone() for t in _unpack(blk, [k, v, dk, dv]))
            k_chunks = rank_chunks(ring_source(rank, step, cp), cp, ctx.layout)
            kr, vr = repeat_kv(kb, heads), repeat_kv(vb, heads)
            dkr, dvr = torch.zeros_like(kr), torch.zeros_like(vr)
            for a, qa in enumerate(q_chunks):
                qs = slice(a * c, (a + 1) * c)
                for b, kc in enumerate(k_chunks):
                    kind = block_kind(qa, kc, ctx.causal)
                    if kind == "skip":
                        continue
                    ks = slice(b * c, (b + 1) * c)
                    g_q, g_k, g_v = _block_backward(q[..., qs, :], kr[..., ks, :], vr[..., ks, :], out[..., qs, :],
                                                    lse[..., qs], dout[..., qs, :], delta[..., qs],
                                                    kind == "diagonal", scale)
                    dq[..., qs, :] += g_q
                    dkr[..., ks, :] += g_k
                    dvr[..., ks, :] += g_v
            dkb += _sum_kv_heads(dkr, kv_heads)
            dvb += _sum_kv_heads(dvr, kv_heads)
            blk = _pack(kb, vb, dkb, dvb)
            if cp > 1:  # the block and its gradients go on; after cp steps they are home
                nxt, reqs = ring.start(blk)
                ring.wait(reqs)
                blk = nxt
        _, _, dk, dv = _unpack(blk, [k, v, dk, dv])
        return dq, dk, dv, None, None, None, None


def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be [batch, heads, seq, head_dim], got shapes {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if k.shape != v.shape or q.shape[-2:] != k.shape[-2:] or q.shape[0] != k.shape[0]:
        raise ValueError(f"k and v must have q's batch, local sequence and head_dim: q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"num_heads={q.shape[1]} must be a multiple of num_kv_heads={k.shape[1]}")


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: Any = None, *, causal: bool = True,
                   layout: str = "balanced", stats: dict | None = None,
                   return_lse: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """This rank's attention output for its shard of the sequence (:func:`shard` with the same ``layout``).

    ``q``: ``[batch, heads, local_seq, head_dim]``; ``k``, ``v``: ``[batch, kv_heads, local_seq, head_dim]``
    (``heads`` a multiple of ``kv_heads``: grouped-query attention; the small K/V travel, each rank repeats
    them locally). ``group``: the context-parallel process group (``None``: the default group, or a single
    process when there is none). ``stats``: a dict that receives the number of ``full``, ``diagonal`` and
    ``skip`` blocks, the unmasked query-key ``pairs`` computed and the ring ``batches`` posted. Differentiable
    in ``q``, ``k`` and ``v``. ``return_lse``: also return the log-sum-exp of each query's scores.

    The result equals ``scaled_dot_product_attention(q, k, v, is_causal=causal)`` on the whole sequence,
    sharded the same way."""
    _check_qkv(q, k, v)
    cp, _ = _group_info(group)
    chunk_len(q.shape[-2] * cp, cp, layout)  # the local length must split into the layout's chunks
    out, lse = _RingAttention.apply(q, k, v, group, causal, layout, stats)
    return (out, lse) if return_lse else out


def simulate_ring(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cp: int, *, causal: bool = True,
                  layout: str = "balanced", stats: list[dict] | None = None) -> torch.Tensor:
    """Ring attention of the whole sequence ``q, k, v [batch, heads, seq, d]`` for ``cp`` ranks, run in this
    process (no communication): each rank's shard, the blocks it would receive step by step, then the ranks'
    outputs gathered back. ``stats``: a list that receives one dict per rank (see :func:`ring_attention`)."""
    _check_qkv(q, k, v)
    outs = []
    for rank in range(cp):
        rank_stats: dict[str, int] = {}
        acc = _Accumulator(shard(q, cp, rank, layout), rank_chunks(rank, cp, layout), causal, rank_stats)
        for step in range(cp):
            src = ring_source(rank, step, cp)
            acc.attend(shard(k, cp, src, layout), shard(v, cp, src, layout), rank_chunks(src, cp, layout))
        outs.append(acc.result()[0])
        if stats is not None:
            stats.append(rank_stats)
    return unshard(outs, layout)


def kv_bytes_per_rank(seq_len: int, cp: int, *, batch: int = 1, heads: int = 32, kv_heads: int = 8,
                      head_dim: int = 128, bytes_per_element: int = 2, ring: bool = True) -> dict[str, int]:
    """Bytes one rank holds for one attention layer: its Q, K, V shards, the scores of one block, and (ring) the
    K/V block in flight. Without context parallelism (``cp=1``) the scores are ``seq × seq`` per head."""
    local = seq_len // cp
    q = batch * heads * local * head_dim * bytes_per_element
    kv = 2 * batch * kv_heads * local * head_dim * bytes_per_element
    block = local if cp > 1 else seq_len
    scores = batch * heads * local * block * bytes_per_element
    return {"q": q, "kv": kv, "kv_in_flight": kv if ring and cp > 1 else 0, "scores": scores,
            "total": q + kv + (kv if ring and cp > 1 else 0) + scores}


__all__ = [
    "LAYOUTS", "num_chunks", "rank_chunks", "chunk_len", "shard_positions", "shard", "unshard", "causal_work",
    "merge_partial", "block_attention", "block_kind", "repeat_kv", "ring_source", "ring_schedule", "RingOp", "ring_p2p_ops",
    "ring_attention", "simulate_ring", "kv_bytes_per_rank",
]
