"""Correct, written another way: one all-reduce per gradient instead of one on the flattened gradients, the
division done in place, and the metric's two sums reduced separately."""
import torch
from torch.utils.data import DataLoader, DistributedSampler

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is written another way
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})


def dp_loader(dataset, dp_rank, dp_size, batch_per_replica, *, seed=0):
    sampler = DistributedSampler(dataset, num_replicas=dp_size, rank=dp_rank, seed=seed, drop_last=True)
    loader = DataLoader(dataset, batch_size=batch_per_replica, sampler=sampler, drop_last=True)
    return loader, sampler


def average_gradients(model, dp_group):
    n = group_size(dp_group)
    for p in model.parameters():
        if p.grad is not None and n > 1:
            p.grad.copy_(all_reduce(p.grad, dp_group, phase="dp"))
            p.grad.div_(n)


def reduce_over_dp(loss_sum, count, dp_group):
    total = all_reduce(loss_sum.double(), dp_group, phase="metrics")
    seen = all_reduce(count.double(), dp_group, phase="metrics")
    return float(total / seen)
