"""Family: sizes that coincide. Passes the number of TP groups (world // tp) where the group size tp belongs: the same
at 2 x 2 on 4 processes, wrong at every other layout."""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is wrong
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})

EXPECT = 'make_tp_group(tp=4)'


def make_tp_group(tp):
    world = dist.get_world_size()
    mine = None
    for ranks in tp_group_ranks(world, world // tp):
        g = dist.new_group(ranks)
        if dist.get_rank() in ranks:
            mine = g
    return mine
