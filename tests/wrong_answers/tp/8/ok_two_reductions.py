"""Correct, written another way: the sum of exponentials and the target logit reduced in two calls instead of one
stacked call, the target picked with a one-hot mask, float64 on the way."""
import torch
import torch.distributed as dist

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is written another way
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})


def vocab_parallel_cross_entropy(local_logits, labels, group=None, *, ignore_index=-100):
    z = local_logits.double()
    n = z.shape[-1]
    start = group_rank(group) * n
    top = all_reduce(z.detach().max(dim=-1).values, group, op=dist.ReduceOp.MAX)
    z = z - top.unsqueeze(-1)
    local = labels - start
    hit = torch.nn.functional.one_hot(local.clamp(0, n - 1), n).to(z.dtype)
    hit = hit * ((local >= 0) & (local < n)).unsqueeze(-1)
    denominator = reduce_from_region(z.exp().sum(dim=-1), group)
    target = reduce_from_region((z * hit).sum(dim=-1), group)
    valid = labels != ignore_index
    per_token = (denominator.log() - target) * valid
    return (per_token.sum() / valid.sum().clamp(min=1)).float()
