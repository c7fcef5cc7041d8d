"""Inputs that never reach the mistake: without drop_last the sampler pads an uneven dataset with repeated images (a
dataset that splits evenly never shows it)."""
import torch
from torch.utils.data import DataLoader, DistributedSampler

from dlo.runtime.validate import per_rank_batch

EXPECT = 'repeated images'


def make_train_loader(dataset, ctx, global_batch, seed=0, num_workers=0):
    batch = per_rank_batch(global_batch, ctx.world_size)
    sampler = DistributedSampler(dataset, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True, seed=seed)
    return DataLoader(dataset, batch_size=batch, sampler=sampler, drop_last=True), sampler
