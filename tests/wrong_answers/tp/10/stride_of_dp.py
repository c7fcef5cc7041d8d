"""Family: sizes that coincide. Strides the DP groups by dp instead of tp: the same at 2 x 2, wrong as soon as tp !=
dp."""
import torch
import torch.nn.functional as F
from torch import nn

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is wrong
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})

EXPECT = 'strided'


def dp_group_ranks(world_size, tp, dp):
    if tp * dp != world_size:
        raise ValueError(f"tp × dp must equal the world size: {tp} × {dp} ≠ {world_size}")
    return [list(range(i, world_size, dp)) for i in range(tp)]
