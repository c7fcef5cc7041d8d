"""Divides by 2, the number of processes it was tried on, instead of the world size."""
import torch.distributed as dist

EXPECT = ["times the average", "world size"]


def allreduce_gradients(model):
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad.div_(2)
