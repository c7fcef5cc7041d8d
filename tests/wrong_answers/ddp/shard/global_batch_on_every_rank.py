"""Gives each rank the global batch: the effective batch is world_size times larger."""
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

from dlo.runtime.validate import per_rank_batch

EXPECT = 'global_batch / world_size'


def make_train_loader(dataset, ctx, global_batch, seed=0, num_workers=0):
    sampler = DistributedSampler(dataset, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True, seed=seed, drop_last=True)
    return DataLoader(dataset, batch_size=global_batch, sampler=sampler), sampler
