"""What one decoder layer keeps for the backward, for context_parallel.ipynb: a Llama-like layer whose attention is
materialised (``softmax(QKᵀ)V``, the ``[seq, seq]`` probabilities saved) or blockwise
(:func:`dlo.parallel.context.ring_attention` on one process), and the bytes autograd saves while it runs."""
from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.nn.functional as F

from dlo.parallel import context as C


def saved_bytes(fn: Callable[..., Any], *args: Any) -> int:
    """Bytes of the activations autograd saves during ``fn(*args)``, each storage once; the weights (saved too, by
    the linears) are not activations: left out."""
    weights = {p.untyped_storage().data_ptr() for p in fn.parameters()} if isinstance(fn, torch.nn.Module) else set()
    seen, total = set(weights), 0

    def pack(t):
        nonlocal total
        key = t.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*args)
    return total


class Layer(torch.nn.Module):
    """A Llama-like decoder layer (RMSNorm, Q/K/V/O projections, ``heads`` / ``kv_heads`` heads, SwiGLU MLP),
    causal; ``materialised``: textbook attention, otherwise the blockwise ring attention of one process."""

    def __init__(self, hidden: int, heads: int = 4, kv_heads: int = 2, materialised: bool = False) -> None:
        super().__init__()
        self.h, self.kv, self.d, self.materialised = heads, kv_heads, hidden // heads, materialised
        self.n1, self.n2 = torch.nn.RMSNorm(hidden), torch.nn.RMSNorm(hidden)
        self.qkv = torch.nn.Linear(hidden, (heads + 2 * kv_heads) * self.d, bias=False)
        self.o = torch.nn.Linear(hidden, hidden, bias=False)
        self.up = torch.nn.Linear(hidden, 8 * hidden // 3 * 2, bias=False)
        self.down = torch.nn.Linear(8 * hidden // 3, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(self.n1(x)).view(b, s, -1, self.d).transpose(1, 2).split([self.h, self.kv, self.kv], 1)
        if self.materialised:
            scores = q @ C.repeat_kv(k, self.h).transpose(-2, -1) / math.sqrt(self.d)
            scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
            att = torch.softmax(scores, -1) @ C.repeat_kv(v, self.h)
        else:
            att = C.ring_attention(q, k, v)  # one process: the blockwise attention of the whole local sequence
        x = x + self.o(att.transpose(1, 2).reshape(b, s, -1))
        gate, up = self.up(self.n2(x)).chunk(2, -1)
        return x + self.down(F.silu(gate) * up)
