"""Family: numerics. Averages the loss over every position, -100 labels included."""
import torch
import torch.nn.functional as F
from torch import nn

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is wrong
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})

EXPECT = 'ignoring -100'


def vocab_parallel_cross_entropy(local_logits, labels, group=None, *, ignore_index=-100):
    logits = gather_from_region(local_logits, group)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1).clamp(min=0))
