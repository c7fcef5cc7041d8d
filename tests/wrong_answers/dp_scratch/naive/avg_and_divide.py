"""Uses ReduceOp.AVG, which already averages, and divides by the world size again."""
import torch.distributed as dist

EXPECT = ["too small", "divided twice"]


def allreduce_gradients(model):
    world = dist.get_world_size()
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
            p.grad /= world
