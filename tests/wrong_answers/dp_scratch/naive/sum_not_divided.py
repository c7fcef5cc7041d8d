"""All-reduces every gradient but forgets that all_reduce sums: each rank steps with N times the mean gradient."""
import torch.distributed as dist

EXPECT = ["too large", "divided by the number of ranks"]


def allreduce_gradients(model):
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)
