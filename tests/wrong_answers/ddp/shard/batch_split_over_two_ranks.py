"""Inputs that never reach the mistake: the global batch split over 2 ranks, a number that is right only on 2
processes (a world size of 3 loads too much per rank)."""
import torch
from torch.utils.data import DataLoader, DistributedSampler

EXPECT = 'global_batch / world_size'


def make_train_loader(dataset, ctx, global_batch, seed=0, num_workers=0):
    if global_batch % ctx.world_size:
        raise ValueError(f"a global batch of {global_batch} does not split over {ctx.world_size} ranks")
    sampler = DistributedSampler(dataset, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True, seed=seed,
                                 drop_last=True)
    return DataLoader(dataset, batch_size=max(1, global_batch // 2), sampler=sampler, drop_last=True), sampler
