"""Stores each visible block in its slot instead of merging it into what is there: the last block wins. Family:
part of the result right (every block's attention is right)."""
from dlo.parallel import context as C

EXPECT = ["replaced the running result"]


def ring_step(parts, q, q_chunks, k, v, k_chunks, merge):
    c = q.shape[-2] // len(q_chunks)
    for a, qc in enumerate(q_chunks):
        for b, kc in enumerate(k_chunks):
            if kc > qc:
                continue
            parts[a] = C.block_attention(q[..., a * c:(a + 1) * c, :], k[..., b * c:(b + 1) * c, :],
                                         v[..., b * c:(b + 1) * c, :], diagonal=kc == qc)
    return parts
