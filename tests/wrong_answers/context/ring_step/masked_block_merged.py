"""Computes a later chunk with every key masked and merges it anyway, trusting the merge to drop it: the block's
softmax over no key is NaN, and the work the balanced layout should save is done. Family: the skip."""
import math

import torch

EXPECT = ["fully masked block", "skipped"]


def ring_step(parts, q, q_chunks, k, v, k_chunks, merge):
    c = q.shape[-2] // len(q_chunks)
    pos = torch.arange(c)
    for a, qc in enumerate(q_chunks):
        for b, kc in enumerate(k_chunks):
            s = q[..., a * c:(a + 1) * c, :] @ k[..., b * c:(b + 1) * c, :].transpose(-2, -1) / math.sqrt(q.shape[-1])
            visible = (kc * c + pos)[None, :] <= (qc * c + pos)[:, None]
            s = s.masked_fill(~visible, float("-inf"))
            lse = torch.logsumexp(s, -1)
            blk = (torch.softmax(s, -1) @ v[..., b * c:(b + 1) * c, :], lse)
            parts[a] = blk if parts[a] is None else merge(*parts[a], *blk)
    return parts
