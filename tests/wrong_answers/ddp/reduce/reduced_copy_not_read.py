"""Flag set but behaviour wrong: the all-reduce runs on a stacked copy, and the numbers returned are read from the local tensors."""
import torch
import torch.distributed as dist

EXPECT = 'its own shard'


def reduce_metrics(loss_sum, correct, count):
    totals = torch.stack([loss_sum.double(), correct.double(), count.double()])
    if dist.is_initialized():
        dist.all_reduce(totals)
    return {"loss": float(loss_sum) / float(count), "accuracy": float(correct) / float(count)}
