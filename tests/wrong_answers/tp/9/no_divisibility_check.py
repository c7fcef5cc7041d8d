"""Family: refusal missing. Never checks that tp divides the world size: the last ranks are silently left out."""
import torch
import torch.nn.functional as F
from torch import nn

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is wrong
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})

EXPECT = 'ValueError'


def tp_group_ranks(world_size, tp):
    return [list(range(k * tp, (k + 1) * tp)) for k in range(world_size // tp)]
