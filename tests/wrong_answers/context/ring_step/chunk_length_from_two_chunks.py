"""Takes the chunk length as half the local sequence (two chunks per rank, as in the balanced layout): with the
contiguous layout, or a single chunk, the blocks are cut in the wrong places. Family: inputs that never reach the
mistake (two chunks per call only)."""
from dlo.parallel import context as C

EXPECT = ["query chunk 2 against key chunk 1", "differs"]


def ring_step(parts, q, q_chunks, k, v, k_chunks, merge):
    c = q.shape[-2] // 2
    parts = list(parts)
    for a, qc in enumerate(q_chunks):
        for b, kc in enumerate(k_chunks):
            if kc > qc:
                continue
            blk = C.block_attention(q[..., a * c:(a + 1) * c, :], k[..., b * c:(b + 1) * c, :],
                                    v[..., b * c:(b + 1) * c, :], diagonal=kc == qc)
            parts[a] = blk if parts[a] is None else merge(*parts[a], *blk)
    return parts
