"""Masks the diagonal block but never skips: a later chunk is computed unmasked, so queries see future keys.
Family: the skip (a flag of the causal mask) forgotten for whole blocks."""
from dlo.parallel import context as C

EXPECT = ["fully masked block", "skipped"]


def ring_step(parts, q, q_chunks, k, v, k_chunks, merge):
    c = q.shape[-2] // len(q_chunks)
    for a, qc in enumerate(q_chunks):
        for b, kc in enumerate(k_chunks):
            blk = C.block_attention(q[..., a * c:(a + 1) * c, :], k[..., b * c:(b + 1) * c, :],
                                    v[..., b * c:(b + 1) * c, :], diagonal=kc == qc)
            parts[a] = blk if parts[a] is None else merge(*parts[a], *blk)
    return parts
