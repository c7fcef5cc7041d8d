"""Attention measured: the textbook ("eager") attention against the fused kernels of
``torch.nn.functional.scaled_dot_product_attention`` (SDPA), in time and in memory saved for backward.

Eager attention computes ``scores = q kᵀ / √d``, masks them, takes the softmax and multiplies by ``v``: the
``[S, S]`` probabilities are a tensor, and autograd keeps them for the backward, so the memory grows with
the *square* of the sequence length. A fused kernel (FlashAttention, memory-efficient attention) walks over
blocks of keys with an online softmax and keeps only its inputs, its output and one log-sum-exp per query
and head; the backward recomputes the scores block by block. Its memory grows *linearly*.

- :func:`eager_attention`: the textbook version (grouped-query K/V repeated to the query heads);
- :func:`sdpa_backends`: which SDPA backends run here, and why the others refuse;
- :func:`attention_fn`: one attention by name ("eager", "math", "flash", "efficient", "cudnn");
- :func:`attention_memory`: bytes autograd saves during the forward (each storage once), CUDA peak too;
- :func:`saved_bytes_formula`: what the theory says those bytes are;
- :func:`time_attention`: forward + backward timed with :mod:`dlo.measure.bench` (warm-up until steady,
  interleaved repeats, median and spread).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from dlo.measure import bench

#: SDPA backends by the short name used in tables and plots.
BACKENDS: dict[str, SDPBackend] = {
    "math": SDPBackend.MATH,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}
#: Backends that never materialise the [S, S] matrix (their saved bytes grow linearly with S).
FUSED = ("efficient", "flash", "cudnn")


def eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """``softmax(q kᵀ / √d + mask) v`` written out: the ``[..., S, S]`` probabilities are materialised.

    ``q`` is ``[batch, heads, S, d]``; ``k`` and ``v`` ``[batch, kv_heads, S_k, d]`` with ``heads`` a multiple
    of ``kv_heads`` (grouped-query attention: each K/V head serves ``heads / kv_heads`` query heads, repeated
    here). ``causal``: query ``i`` sees keys ``0..i`` (aligned at the start, as SDPA's ``is_causal``).
    """
    heads, kv_heads = q.shape[-3], k.shape[-3]
    if heads % kv_heads:
        raise ValueError(f"eager_attention: {heads} query heads is not a multiple of {kv_heads} K/V heads")
    if kv_heads != heads:
        k = k.repeat_interleave(heads // kv_heads, dim=-3)
        v = v.repeat_interleave(heads // kv_heads, dim=-3)
    scores = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(q.shape[-1]))
    if causal:
        s_q, s_k = q.shape[-2], k.shape[-2]
        hidden = torch.ones(s_q, s_k, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(hidden, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def attention_fn(name: str) -> Callable[..., torch.Tensor]:
    """The attention called ``name``: "eager" (:func:`eager_attention`) or an SDPA backend of
    :data:`BACKENDS`, forced with ``sdpa_kernel`` (it raises if that backend cannot run the inputs)."""
    if name == "eager":
        return eager_attention
    if name not in BACKENDS:
        raise ValueError(f"unknown attention {name!r}: use 'eager' or one of {', '.join(BACKENDS)}")
    backend = BACKENDS[name]

    def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                  enable_gqa=k.shape[-3] != q.shape[-3])
    sdpa.__name__ = f"sdpa_{name}"
    return sdpa


def sdpa_backends(device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> dict[str, str | None]:
    """Which SDPA backends run on ``device`` with this torch: ``{name: None}`` for one that ran forward and
    backward on a tiny input, ``{name: reason}`` (one line) for one that refused."""
    dev = torch.device(device)
    out: dict[str, str | None] = {}
    for name in BACKENDS:
        q, k, v = (torch.randn(1, 2, 16, 16, device=dev, dtype=dtype, requires_grad=True) for _ in range(3))
        try:
            attention_fn(name)(q, k, v, causal=True).sum().backward()
            out[name] = None
        except (RuntimeError, NotImplementedError, ValueError) as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0].split(". ")[0].rstrip(".")
            out[name] = f"{type(e).__name__} on {dev.type}, {str(dtype).removeprefix('torch.')}: {first}"
    return out


def attention_memory(fn: Callable[..., torch.Tensor], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     causal: bool = False) -> dict[str, Any]:
    """Memory of one forward of ``fn(q, k, v, causal)``.

    ``saved_bytes``: the bytes of the tensors autograd saves for the backward (``saved_tensors_hooks``), each
    storage counted once (two views of one tensor are one allocation), the inputs included when saved.
    ``peak_bytes``: on CUDA, the peak allocated memory during forward + backward above what was allocated
    before; None elsewhere. ``saved_shapes``: what was saved, for reading.
    """
    seen: set[int] = set()
    saved: list[tuple[tuple[int, ...], str, int]] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            saved.append((tuple(t.shape), str(t.dtype).removeprefix("torch."), storage.nbytes()))
        return t

    cuda = q.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(q.device)
        torch.cuda.reset_peak_memory_stats(q.device)
        before = torch.cuda.memory_allocated(q.device)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(q, k, v, causal)
    peak = None
    if cuda:
        out.sum().backward()
        torch.cuda.synchronize(q.device)
        peak = torch.cuda.max_memory_allocated(q.device) - before
    return {"saved_bytes": sum(n for _, _, n in saved), "peak_bytes": peak,
            "saved_shapes": [f"{list(s)} {d}" for s, d, _ in saved]}


def saved_bytes_formula(batch: int, heads: int, seq: int, head_dim: int, *, dtype_bytes: int = 4,
                        fused: bool, mask_bytes: int = 0, kv_heads: int | None = None) -> int:
    """The bytes attention saves for backward, from the theory.

    - materialised (``fused=False``: eager, SDPA's math backend): the inputs Q, K, V (K/V at ``heads``
      width: repeated for grouped-query attention) plus the softmax output, ``batch·heads·S²·dtype_bytes``,
      plus ``mask_bytes`` (a boolean ``[S, S]`` causal mask is ``S²`` bytes; a dropout mask would be
      ``batch·heads·S²``);
    - fused (flash, memory-efficient, cuDNN): Q, K, V (``kv_heads`` wide), the output, and one fp32
      log-sum-exp per query and head, ``batch·heads·S·4``.
    """
    kv = heads if kv_heads is None or not fused else kv_heads
    q_bytes = batch * heads * seq * head_dim * dtype_bytes
    kv_bytes = 2 * batch * kv * seq * head_dim * dtype_bytes
    if fused:
        return q_bytes + kv_bytes + q_bytes + batch * heads * seq * 4
    return q_bytes + kv_bytes + batch * heads * seq * seq * dtype_bytes + mask_bytes


def forward_backward(fn: Callable[..., torch.Tensor], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     causal: bool = False) -> Callable[[], None]:
    """A call that runs ``fn`` forward and backward once on leaves ``q, k, v`` (gradients reset each call)."""
    grad = torch.randn(q.shape, dtype=q.dtype, device=q.device)

    def call() -> None:
        for t in (q, k, v):
            t.grad = None
        fn(q, k, v, causal).backward(grad)
    return call


def time_attention(names: list[str], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                   repeats: int = 5, warmup: bench.Warmup | int = bench.Warmup(), progress: bool = False,
                   timer: bench.Timer | None = None, **extra: Any) -> dict[str, bench.Measurement]:
    """Forward + backward of each attention in ``names`` ("eager" or SDPA backends), timed *interleaved*
    with :func:`dlo.measure.bench.measure_interleaved` (warm-up until steady, median and spread). The
    throughput is in tokens/s (``batch · S`` tokens per call); ``extra`` is recorded with each measurement."""
    tokens = q.shape[0] * q.shape[-2]
    cands = [bench.Candidate(name, forward_backward(attention_fn(name), q, k, v, causal), tokens, q.device,
                             extra={"attention": name, "seq": q.shape[-2], "causal": causal, **extra})
             for name in names]
    return bench.measure_interleaved(cands, repeats=repeats, warmup=warmup, unit="tok/s", track_memory=False,
                                     progress=progress, timer=timer)


def leaves(batch: int, heads: int, seq: int, head_dim: int, *, kv_heads: int | None = None,
           dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
           generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random Q ``[batch, heads, seq, head_dim]`` and K, V ``[batch, kv_heads, seq, head_dim]``, leaves that
    require gradients."""
    kv = heads if kv_heads is None else kv_heads
    shapes = [(batch, heads, seq, head_dim), (batch, kv, seq, head_dim), (batch, kv, seq, head_dim)]
    return tuple(torch.randn(s, generator=generator, dtype=dtype).to(device).requires_grad_() for s in shapes)


def growth(records: Mapping[int, int]) -> dict[int, float]:
    """``{S: bytes}`` → ``{S: bytes(S) / bytes(previous S)}`` for consecutive lengths."""
    seqs = sorted(records)
    return {b: records[b] / records[a] for a, b in zip(seqs, seqs[1:])}


@dataclass(frozen=True)
class SDPACase:
    """What decides which SDPA backend can run one attention call (the attention exercise's input).

    ``device``: "cpu" or "cuda"; ``dtype``: of q, k and v; ``head_dim``: the last dimension of q, k, v;
    ``is_causal``: SDPA's causal flag; ``has_mask``: an explicit ``attn_mask`` tensor is passed (boolean or
    additive); ``dropout_p``: SDPA's dropout probability; ``capability``: the GPU's compute capability
    ``(major, minor)`` (``torch.cuda.get_device_capability()``: (8, 0) for an A100, (9, 0) for an H100), None on
    a CPU.
    """
    device: str
    dtype: torch.dtype
    head_dim: int
    is_causal: bool = False
    has_mask: bool = False
    dropout_p: float = 0.0
    capability: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"SDPACase: device must be 'cpu' or 'cuda', got {self.device!r}")
        if not isinstance(self.head_dim, int) or isinstance(self.head_dim, bool) or self.head_dim < 1:
            raise ValueError(f"SDPACase: head_dim must be a positive integer, got {self.head_dim!r}")
        if self.is_causal and self.has_mask:
            raise ValueError("SDPACase: SDPA takes is_causal or an attn_mask, not both")
        if not 0.0 <= self.dropout_p < 1.0:
            raise ValueError(f"SDPACase: dropout_p must be in [0, 1), got {self.dropout_p!r}")
        if (self.device == "cuda") != (self.capability is not None):
            raise ValueError("SDPACase: a 'cuda' case needs its compute capability (major, minor), a 'cpu' case none")

    @classmethod
    def of(cls, q: torch.Tensor, *, is_causal: bool = False, attn_mask: torch.Tensor | None = None,
           dropout_p: float = 0.0) -> "SDPACase":
        """The case of an SDPA call on ``q`` (and k, v of the same dtype, device and head_dim)."""
        cap = torch.cuda.get_device_capability(q.device) if q.device.type == "cuda" else None
        return cls(q.device.type, q.dtype, int(q.shape[-1]), is_causal, attn_mask is not None, dropout_p, cap)
