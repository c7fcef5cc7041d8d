"""Family: sum or mean. Divides by the DP size before the all-reduce and again after it: the mean gradient divided by
dp."""
import torch
import torch.nn.functional as F
from torch import nn

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is wrong
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})

EXPECT = 'divided twice'


def average_gradients(model, dp_group):
    n = group_size(dp_group)
    if n == 1:
        return
    for p in model.parameters():
        if p.grad is not None:
            p.grad.copy_(all_reduce(p.grad / n, dp_group, phase="dp") / n)
