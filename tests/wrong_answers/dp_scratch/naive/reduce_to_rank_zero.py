"""dist.reduce sends the sum to rank 0 only: the other ranks keep their own gradients and the copies drift apart."""
import torch.distributed as dist

EXPECT = "all_reduce"


def allreduce_gradients(model):
    world = dist.get_world_size()
    for p in model.parameters():
        if p.grad is not None:
            dist.reduce(p.grad, dst=0)
            p.grad /= world
