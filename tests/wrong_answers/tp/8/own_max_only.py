"""Family: numerics. Subtracts this rank's own max without the all-reduce: the ranks' sums of exp are then on different
scales and cannot be added."""
import torch
import torch.nn.functional as F
from torch import nn

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is wrong
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})

EXPECT = 'OWN max'


def vocab_parallel_cross_entropy(local_logits, labels, group=None, *, ignore_index=-100):
    r = group_rank(group)
    z = local_logits.float()
    n = z.shape[-1]
    start = r * n
    z = z - z.detach().amax(dim=-1, keepdim=True)
    inside = (labels >= start) & (labels < start + n)
    target = z.gather(-1, (labels - start).clamp(0, n - 1).unsqueeze(-1)).squeeze(-1) * inside
    sums = reduce_from_region(torch.stack((z.exp().sum(dim=-1), target)), group)
    per_token = sums[0].log() - sums[1]
    valid = labels != ignore_index
    return (per_token * valid).sum() / valid.sum().clamp(min=1)
