"""Family: wrong shard. Clamps the ids into this rank's range but does not zero the rows of other ranks' ids: the sum
adds wrong rows."""
import torch
import torch.nn.functional as F
from torch import nn

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is wrong
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})

EXPECT = 'mask ids outside'


_Reference = VocabParallelEmbedding


class VocabParallelEmbedding(_Reference):
    def forward(self, ids):
        local = (ids - self.vocab_start).clamp(0, self.weight.shape[0] - 1)
        return reduce_from_region(F.embedding(local, self.weight), self.group)
