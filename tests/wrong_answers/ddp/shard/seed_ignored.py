"""Flag set, behaviour wrong: the same seed on every rank, but a constant one -- the seed argument never reaches the
sampler (a check with one seed does not see it)."""
import torch
from torch.utils.data import DataLoader, DistributedSampler

from dlo.runtime.validate import per_rank_batch

EXPECT = 'seed argument'


def make_train_loader(dataset, ctx, global_batch, seed=0, num_workers=0):
    batch = per_rank_batch(global_batch, ctx.world_size)
    sampler = DistributedSampler(dataset, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True, seed=3,
                                 drop_last=True)
    return DataLoader(dataset, batch_size=batch, sampler=sampler), sampler
