"""All-reduces a new tensor (p.grad / world builds one): the average lands in a temporary, p.grad is untouched."""
import torch.distributed as dist

EXPECT = ["own gradient", "not on a copy"]


def allreduce_gradients(model):
    world = dist.get_world_size()
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad / world)
