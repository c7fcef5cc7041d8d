"""Broadcasts a float copy of each tensor and copies back only the floating-point ones: the integer BatchNorm
counter (num_batches_tracked) keeps each rank's own value."""
import itertools

import torch
import torch.distributed as dist

EXPECT = ["buffers", "num_batches_tracked"]


def broadcast_state(model):
    with torch.no_grad():
        for t in itertools.chain(model.parameters(), model.buffers()):
            buf = t.detach().clone()
            dist.broadcast(buf, src=0)
            if t.is_floating_point():
                t.copy_(buf)
