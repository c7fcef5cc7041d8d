"""Averages the gradients of the weight matrices only (dim() > 1): the biases keep each rank's own gradient."""
import torch.distributed as dist

EXPECT = ["bias", "own gradient"]


def allreduce_gradients(model):
    for p in model.parameters():
        if p.grad is not None and p.grad.dim() > 1:
            dist.all_reduce(p.grad)
            p.grad.div_(dist.get_world_size())
