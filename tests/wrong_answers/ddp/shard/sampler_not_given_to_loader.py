"""Builds the sampler but lets the DataLoader shuffle on its own: every rank reads the whole dataset."""
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

from dlo.runtime.validate import per_rank_batch

EXPECT = 'draw from the sampler'


def make_train_loader(dataset, ctx, global_batch, seed=0, num_workers=0):
    batch = per_rank_batch(global_batch, ctx.world_size)
    sampler = DistributedSampler(dataset, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True, seed=seed, drop_last=True)
    return DataLoader(dataset, batch_size=batch, shuffle=True), sampler
