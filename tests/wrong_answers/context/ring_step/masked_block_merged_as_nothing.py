"""Computes every block, a later chunk with all its keys masked, cleans its NaN output to 0 and lets the merge drop it
(lse = -inf): the values are right, but the work the causal skip saves is done anyway, and merged. Family: the value
right, the behaviour (no work, no merge for a fully masked block) wrong."""
import math

import torch

EXPECT = ["fully masked block", "skipped", "no merge"]


def ring_step(parts, q, q_chunks, k, v, k_chunks, merge):
    c = q.shape[-2] // len(q_chunks)
    pos = torch.arange(c)
    for a, qc in enumerate(q_chunks):
        for b, kc in enumerate(k_chunks):
            s = q[..., a * c:(a + 1) * c, :] @ k[..., b * c:(b + 1) * c, :].transpose(-2, -1) / math.sqrt(q.shape[-1])
            visible = (kc * c + pos)[None, :] <= (qc * c + pos)[:, None]
            s = s.masked_fill(~visible, float("-inf"))
            lse = torch.logsumexp(s, -1)
            out = torch.nan_to_num(torch.softmax(s, -1), nan=0.0) @ v[..., b * c:(b + 1) * c, :]
            blk = (out, lse)
            parts[a] = blk if parts[a] is None else merge(*parts[a], *blk)
    return parts
