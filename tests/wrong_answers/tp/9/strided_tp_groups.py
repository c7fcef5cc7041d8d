"""Family: wrong shard. Builds the TP groups strided ([0, 2], [1, 3]): TP then communicates across nodes at every
layer."""
import torch
import torch.nn.functional as F
from torch import nn

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is wrong
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})

EXPECT = 'contiguous'


def tp_group_ranks(world_size, tp):
    if world_size % tp:
        raise ValueError("tp must divide the world size")
    return [list(range(k, world_size, world_size // tp)) for k in range(world_size // tp)]
