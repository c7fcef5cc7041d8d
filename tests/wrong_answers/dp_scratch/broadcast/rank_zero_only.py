"""Only rank 0 "sends its weights": a broadcast is a collective, the receivers must call it too (or rank 0 hangs)."""
import itertools

import torch
import torch.distributed as dist

EXPECT = "every rank must call it"


def broadcast_state(model):
    if dist.get_rank() == 0:
        with torch.no_grad():
            for t in itertools.chain(model.parameters(), model.buffers()):
                dist.broadcast(t, src=0)
