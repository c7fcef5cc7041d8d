"""Family: wrong shard. Gives each DP replica's DataLoader batch_per_replica * dp_size sequences (the global batch):
every step then reads dp times too many."""
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is wrong
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})

EXPECT = 'batch_per_replica'


def dp_loader(dataset, dp_rank, dp_size, batch_per_replica, *, seed=0):
    sampler = DistributedSampler(dataset, num_replicas=dp_size, rank=dp_rank, shuffle=True, seed=seed, drop_last=True)
    return DataLoader(dataset, batch_size=batch_per_replica * dp_size, sampler=sampler, drop_last=True), sampler
