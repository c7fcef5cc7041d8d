"""Family: wrong shard. Masks the ids above vocab_end but counts vocab_end itself as this rank's (> instead of >=),
clamping it to the last local row: the first id of the next slice adds a wrong row to the sum."""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is wrong
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})

EXPECT = "mask ids outside"

_Reference = VocabParallelEmbedding


class VocabParallelEmbedding(_Reference):
    def forward(self, ids):
        outside = (ids < self.vocab_start) | (ids > self.vocab_end)
        local = (ids - self.vocab_start).clamp(0, self.weight.shape[0] - 1)
        out = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        return reduce_from_region(out, self.group)
