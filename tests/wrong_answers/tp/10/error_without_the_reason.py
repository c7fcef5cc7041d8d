"""Family: refusal missing. Raises ValueError('bad sizes'): the message does not say tp x dp must equal the world size."""
import torch
import torch.nn.functional as F
from torch import nn

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is wrong
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})

EXPECT = 'world size'


def dp_group_ranks(world_size, tp, dp):
    if tp * dp != world_size:
        raise ValueError("bad sizes")
    return [list(range(k, world_size, tp)) for k in range(tp)]
