"""Family: wrong group. reduce_over_dp sums over all ranks (no group): the TP ranks' identical numbers are counted tp
times."""
import torch
import torch.nn.functional as F
from torch import nn

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is wrong
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})

EXPECT = 'over the DP group only'


def reduce_over_dp(loss_sum, count, dp_group):
    total = torch.stack([loss_sum.double(), count.double()])
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(total)  # no group: over every rank
    return float(total[0] / total[1])


_reference_average_gradients = average_gradients


def average_gradients(model, dp_group):  # unchanged, but defined here: the checker runs the file that defines it
    return _reference_average_gradients(model, dp_group)
