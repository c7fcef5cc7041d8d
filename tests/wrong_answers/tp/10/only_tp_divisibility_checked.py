"""Family: refusal missing. Checks only that tp divides the world size: tp=2, dp=3 on 4 processes builds groups with
missing ranks instead of failing."""
import torch
import torch.nn.functional as F
from torch import nn

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is wrong
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})

EXPECT = 'raise ValueError'


def dp_group_ranks(world_size, tp, dp):
    if world_size % tp:
        raise ValueError(f"tp={tp} must divide the world size {world_size}")
    return [list(range(i, world_size, tp)) for i in range(tp)]
