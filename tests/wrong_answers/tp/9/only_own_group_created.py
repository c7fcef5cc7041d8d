"""Family: wrong group. Calls dist.new_group only for the group this rank belongs to: new_group is collective, every
rank must call it for every group, in the same order."""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is wrong
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})

EXPECT = 'every TP group'


def make_tp_group(tp):
    for ranks in tp_group_ranks(dist.get_world_size(), tp):
        if dist.get_rank() in ranks:
            return dist.new_group(ranks)
