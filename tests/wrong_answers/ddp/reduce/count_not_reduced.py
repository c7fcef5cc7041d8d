"""Sums the loss and the correct answers but not the count: divides a global sum by a local count."""
import torch
import torch.distributed as dist
from torch import nn

EXPECT = 'global loss'


def reduce_metrics(loss_sum, correct, count):
    totals = torch.stack([loss_sum.double(), correct.double()])
    if dist.is_initialized():
        dist.all_reduce(totals)
    return {"loss": float(totals[0] / count), "accuracy": float(totals[1] / count)}
