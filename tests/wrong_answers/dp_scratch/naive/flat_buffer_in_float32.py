"""Inputs that never reach the mistake: the gradients packed into a float32 buffer (torch.zeros' default dtype) and
copied back: an fp64 model's averages keep only float32's 24 bits (a tolerance of 1e-6 never shows it)."""
import torch
import torch.distributed as dist

EXPECT = ["float64", "differ"]


def allreduce_gradients(model):
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.zeros(sum(g.numel() for g in grads))
    offset = 0
    for g in grads:
        flat[offset:offset + g.numel()] = g.reshape(-1)
        offset += g.numel()
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()
