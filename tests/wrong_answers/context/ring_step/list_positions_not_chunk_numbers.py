"""Decides the kind of block from the places in the lists (a, b) instead of the chunk numbers: right for the first
rank's first step only. Family: inputs that never reach the mistake (one chunk each, rank 0)."""
from dlo.parallel import context as C

EXPECT = ["chunk numbers"]


def ring_step(parts, q, q_chunks, k, v, k_chunks, merge):
    c = q.shape[-2] // len(q_chunks)
    for a in range(len(q_chunks)):
        for b in range(len(k_chunks)):
            if b > a:
                continue
            blk = C.block_attention(q[..., a * c:(a + 1) * c, :], k[..., b * c:(b + 1) * c, :],
                                    v[..., b * c:(b + 1) * c, :], diagonal=a == b)
            parts[a] = blk if parts[a] is None else merge(*parts[a], *blk)
    return parts
