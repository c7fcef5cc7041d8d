"""A correct alternative: the visibility of each (query, key) pair from the token positions, a block with no visible
pair skipped, and the merge called with the new block first (the merge is symmetric)."""
import math

import torch


def ring_step(parts, q, q_chunks, k, v, k_chunks, merge):
    out = list(parts)
    c = q.shape[-2] // len(q_chunks)
    pos = torch.arange(c)
    for a, qc in enumerate(q_chunks):
        for b, kc in enumerate(k_chunks):
            visible = (kc * c + pos)[None, :] <= (qc * c + pos)[:, None]
            if not visible.any():
                continue
            s = q[..., a * c:(a + 1) * c, :] @ k[..., b * c:(b + 1) * c, :].transpose(-2, -1) / math.sqrt(q.shape[-1])
            s = s.masked_fill(~visible, float("-inf"))
            blk = (torch.softmax(s, -1) @ v[..., b * c:(b + 1) * c, :], torch.logsumexp(s, -1))
            out[a] = blk if out[a] is None else merge(*blk, *out[a])
    return out
