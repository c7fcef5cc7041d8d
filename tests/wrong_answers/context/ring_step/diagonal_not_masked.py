"""Skips the later chunks but computes the diagonal block without its mask: inside its own chunk a query sees the
keys after it. Family: the mask inside the diagonal block."""
from dlo.parallel import context as C

EXPECT = ["diagonal block is not masked"]


def ring_step(parts, q, q_chunks, k, v, k_chunks, merge):
    c = q.shape[-2] // len(q_chunks)
    for a, qc in enumerate(q_chunks):
        for b, kc in enumerate(k_chunks):
            if kc > qc:
                continue
            blk = C.block_attention(q[..., a * c:(a + 1) * c, :], k[..., b * c:(b + 1) * c, :],
                                    v[..., b * c:(b + 1) * c, :])
            parts[a] = blk if parts[a] is None else merge(*parts[a], *blk)
    return parts
