"""Correct, written another way: the DP groups read as the columns of the ranks laid out dp x tp."""
import torch
import torch.distributed as dist

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is written another way
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})


def dp_group_ranks(world_size, tp, dp):
    if tp * dp != world_size:
        raise ValueError(f"tp x dp = {tp * dp} must equal the world size {world_size}")
    return torch.arange(world_size).view(dp, tp).t().tolist()


def make_dp_group(tp, dp):
    mine = None
    for ranks in dp_group_ranks(dist.get_world_size(), tp, dp):
        group = dist.new_group(ranks)
        if dist.get_rank() in ranks:
            mine = group
    return mine
