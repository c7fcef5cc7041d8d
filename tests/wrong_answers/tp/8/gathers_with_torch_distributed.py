"""Family: right numbers, wrong traffic. Gathers the full logits with torch.distributed.all_gather directly (this
rank's slice kept in the graph, so loss and gradients come out right), then F.cross_entropy: every rank holds
[batch, seq, vocab] again, the memory the vocab-parallel loss exists to save."""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is wrong
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})

EXPECT = "must not gather the logits"


def vocab_parallel_cross_entropy(local_logits, labels, group=None, *, ignore_index=-100):
    if group is None or not dist.is_initialized() or dist.get_world_size(group) == 1:
        full = local_logits
    else:
        parts = [torch.empty_like(local_logits) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, local_logits.detach().contiguous(), group=group)
        parts[dist.get_rank(group)] = local_logits
        full = torch.cat(parts, dim=-1)
    return F.cross_entropy(full.reshape(-1, full.shape[-1]), labels.reshape(-1), ignore_index=ignore_index)
