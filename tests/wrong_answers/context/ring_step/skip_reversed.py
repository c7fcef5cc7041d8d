"""Skips the earlier chunks instead of the later ones (the comparison turned round). Family: the skip rule."""
from dlo.parallel import context as C

EXPECT = ["earlier keys was skipped"]


def ring_step(parts, q, q_chunks, k, v, k_chunks, merge):
    c = q.shape[-2] // len(q_chunks)
    for a, qc in enumerate(q_chunks):
        for b, kc in enumerate(k_chunks):
            if kc < qc:
                continue
            blk = C.block_attention(q[..., a * c:(a + 1) * c, :], k[..., b * c:(b + 1) * c, :],
                                    v[..., b * c:(b + 1) * c, :], diagonal=kc == qc)
            parts[a] = blk if parts[a] is None else merge(*parts[a], *blk)
    return parts
