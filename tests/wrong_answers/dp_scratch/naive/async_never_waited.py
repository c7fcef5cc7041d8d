"""Launches asynchronous all-reduces and divides at once: the division runs before the sums have arrived."""
import torch.distributed as dist

EXPECT = "never waited for"


def allreduce_gradients(model):
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, async_op=True)
            p.grad.div_(dist.get_world_size())
