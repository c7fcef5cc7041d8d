"""Broadcasts only the parameters that require grad, and the buffers: a frozen layer keeps each rank's own weights."""
import torch
import torch.distributed as dist

EXPECT = ["parameter", "did not receive rank 0's values"]


def broadcast_state(model):
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                dist.broadcast(p, src=0)
        for b in model.buffers():
            dist.broadcast(b, src=0)
