"""Correct: the divisibility checked by hand (ValueError), a plain DataLoader with the sampler."""
import torch
from torch.utils.data import DataLoader, DistributedSampler


def make_train_loader(dataset, ctx, global_batch, seed=0, num_workers=0):
    if global_batch % ctx.world_size:
        raise ValueError(f"a global batch of {global_batch} does not split over {ctx.world_size} ranks")
    sampler = DistributedSampler(dataset, num_replicas=ctx.world_size, rank=ctx.rank, seed=seed, shuffle=True,
                                 drop_last=True)
    loader = DataLoader(dataset, batch_size=global_batch // ctx.world_size, sampler=sampler,
                        num_workers=num_workers, drop_last=True)
    return loader, sampler
