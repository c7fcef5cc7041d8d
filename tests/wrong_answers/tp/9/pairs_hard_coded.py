"""Family: sizes that coincide. Builds the groups as consecutive pairs whatever tp is: right at tp=2 only."""
import torch
import torch.nn.functional as F
from torch import nn

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is wrong
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})

EXPECT = 'blocks of 4'


def tp_group_ranks(world_size, tp):
    if world_size % tp:
        raise ValueError(f"tp={tp} must divide the world size {world_size}")
    return [[k, k + 1] for k in range(0, world_size, 2)]
