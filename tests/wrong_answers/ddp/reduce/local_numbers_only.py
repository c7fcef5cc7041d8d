"""Divides the local sums: every rank reports its own shard's numbers."""
import torch
import torch.distributed as dist
from torch import nn

EXPECT = "its own shard's numbers"


def reduce_metrics(loss_sum, correct, count):
    return {"loss": float(loss_sum) / float(count), "accuracy": float(correct) / float(count)}
