"""Correct, written another way: the out-of-range ids are clamped into the local table and their rows multiplied by
a 0/1 mask instead of masked_fill."""
import torch
import torch.nn.functional as F

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is written another way
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})


_Reference = VocabParallelEmbedding


class VocabParallelEmbedding(_Reference):
    def forward(self, ids):
        n = self.vocab_end - self.vocab_start
        inside = (ids >= self.vocab_start) & (ids < self.vocab_end)
        rows = F.embedding((ids - self.vocab_start).clamp(0, n - 1), self.weight)
        return reduce_from_region(rows * inside.unsqueeze(-1).to(rows.dtype), self.group)
