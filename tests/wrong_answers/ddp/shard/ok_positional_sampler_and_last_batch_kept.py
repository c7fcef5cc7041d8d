"""Correct: DistributedSampler built with positional arguments, the loader keeping its last, smaller batch (every rank
still takes the same number of steps: the shards have equal lengths)."""
import torch
from torch.utils.data import DataLoader, DistributedSampler


def make_train_loader(dataset, ctx, global_batch, *, seed=0, num_workers=0):
    per_rank = global_batch // ctx.world_size
    if per_rank * ctx.world_size != global_batch:
        raise ValueError(f"{global_batch} is not a multiple of {ctx.world_size}")
    sampler = DistributedSampler(dataset, ctx.world_size, ctx.rank, True, seed, True)
    return DataLoader(dataset, batch_size=per_rank, sampler=sampler, num_workers=num_workers), sampler
