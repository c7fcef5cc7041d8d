"""Family: wrong group. Creates every group but returns the last one made, whichever rank asks."""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is wrong
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})

EXPECT = 'belongs to'


def make_tp_group(tp):
    g = None
    for ranks in tp_group_ranks(dist.get_world_size(), tp):
        g = dist.new_group(ranks)
    return g
