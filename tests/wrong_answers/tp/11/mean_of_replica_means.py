"""Family: sum or mean. Averages the replicas' mean losses: right only when every replica counted as many tokens."""
import torch
import torch.nn.functional as F
from torch import nn

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is wrong
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})

EXPECT = "mean of the replicas' means"


def reduce_over_dp(loss_sum, count, dp_group):
    mean = (loss_sum.double() / count.double()).reshape(1)
    return float(all_reduce(mean, dp_group, phase="metrics") / group_size(dp_group))
