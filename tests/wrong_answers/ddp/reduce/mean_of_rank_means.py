"""All-reduces each rank's mean and averages: wrong when the shards differ in size."""
import torch
import torch.distributed as dist
from torch import nn

EXPECT = "averaging the ranks' means"


def reduce_metrics(loss_sum, correct, count):
    means = torch.stack([loss_sum.double() / count.double(), correct.double() / count.double()])
    if dist.is_initialized():
        dist.all_reduce(means)
        means /= dist.get_world_size()
    return {"loss": float(means[0]), "accuracy": float(means[1])}
