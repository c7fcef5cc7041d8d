"""Correct: every gradient packed into one flat tensor, a single all-reduce, the averages copied back."""
import torch
import torch.distributed as dist


def allreduce_gradients(model):
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()
