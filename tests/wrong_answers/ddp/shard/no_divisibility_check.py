"""Floors global_batch / world_size: a global batch of 9 on 2 ranks silently becomes 8."""
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

from dlo.runtime.validate import per_rank_batch

EXPECT = 'ValueError'


def make_train_loader(dataset, ctx, global_batch, seed=0, num_workers=0):
    batch = global_batch // ctx.world_size
    sampler = DistributedSampler(dataset, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True, seed=seed, drop_last=True)
    return DataLoader(dataset, batch_size=batch, sampler=sampler), sampler
