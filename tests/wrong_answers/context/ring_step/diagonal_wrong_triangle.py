"""Masks the diagonal block by hand with triu: each query keeps the keys from itself to the end of the chunk, the
opposite of causal. Family: the mask inside the diagonal block."""
import math

import torch

EXPECT = ["wrong triangle"]


def _attend(q, k, v, diagonal):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if diagonal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).triu(), float("-inf"))
    lse = torch.logsumexp(s, -1)
    return torch.softmax(s, -1) @ v, lse


def ring_step(parts, q, q_chunks, k, v, k_chunks, merge):
    c = q.shape[-2] // len(q_chunks)
    for a, qc in enumerate(q_chunks):
        for b, kc in enumerate(k_chunks):
            if kc > qc:
                continue
            blk = _attend(q[..., a * c:(a + 1) * c, :], k[..., b * c:(b + 1) * c, :], v[..., b * c:(b + 1) * c, :],
                          kc == qc)
            parts[a] = blk if parts[a] is None else merge(*parts[a], *blk)
    return parts
