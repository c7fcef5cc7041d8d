"""Family: sizes that coincide. Calls dp_group_ranks(world, dp, tp) in make_dp_group: the same at 2 x 2, wrong at 4 x 1
or 1 x 4."""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is wrong
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})

EXPECT = 'make_dp_group(tp=4, dp=1)'


def make_dp_group(tp, dp):
    mine = None
    for ranks in dp_group_ranks(dist.get_world_size(), dp, tp):
        g = dist.new_group(ranks)
        if dist.get_rank() in ranks:
            mine = g
    return mine
