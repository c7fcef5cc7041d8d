"""Correct: every broadcast launched asynchronously, all handles waited for before returning."""
import itertools

import torch
import torch.distributed as dist


def broadcast_state(model):
    with torch.no_grad():
        handles = [dist.broadcast(t, src=0, async_op=True)
                   for t in itertools.chain(model.parameters(), model.buffers())]
        for h in handles:
            h.wait()
