"""A correct alternative: the tensors split into their chunks first, then one pass over the pairs."""
from dlo.parallel import context as C


def ring_step(parts, q, q_chunks, k, v, k_chunks, merge):
    n = len(q_chunks)
    qs, ks, vs = q.chunk(n, dim=-2), k.chunk(len(k_chunks), dim=-2), v.chunk(len(k_chunks), dim=-2)
    new = list(parts)
    for a, qc in enumerate(q_chunks):
        for kb, vb, kc in zip(ks, vs, k_chunks):
            if kc <= qc:
                blk = C.block_attention(qs[a], kb, vb, diagonal=(kc == qc))
                new[a] = merge(*new[a], *blk) if new[a] is not None else blk
    return new
