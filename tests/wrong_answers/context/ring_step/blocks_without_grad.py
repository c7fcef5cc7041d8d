"""Computes each block's attention under torch.no_grad() ("the running result is a buffer"): the values are right,
but no gradient reaches q, k or v, and ring attention cannot be trained through. Family: values checked, gradients
not."""
import torch

from dlo.parallel import context as C

EXPECT = ["no gradient reaches q, k or v"]


def ring_step(parts, q, q_chunks, k, v, k_chunks, merge):
    c = q.shape[-2] // len(q_chunks)
    parts = list(parts)
    for a, qc in enumerate(q_chunks):
        for b, kc in enumerate(k_chunks):
            if kc > qc:
                continue
            with torch.no_grad():
                blk = C.block_attention(q[..., a * c:(a + 1) * c, :], k[..., b * c:(b + 1) * c, :],
                                        v[..., b * c:(b + 1) * c, :], diagonal=kc == qc)
            parts[a] = blk if parts[a] is None else merge(*parts[a], *blk)
    return parts
