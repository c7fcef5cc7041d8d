"""Family: right numbers, wrong traffic. Builds lm_head with gather_output=True: local_logits then holds the whole
vocabulary and forward gathers it a second time."""
import copy

import torch
import torch.nn.functional as F
from torch import nn

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is wrong
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})

EXPECT = 'gathered logits'


class TPLlama(nn.Module):
    def __init__(self, full, group=None):
        super().__init__()
        self.cfg, self.group, self.rope_theta = full.cfg, group, full.rope_theta
        self.embed_tokens = VocabParallelEmbedding(full.embed_tokens, group)
        self.layers = nn.ModuleList(TPDecoderBlock(b, group) for b in full.layers)
        self.norm = copy.deepcopy(full.norm)
        self.lm_head = ColumnParallelLinear(full.lm_head, group, gather_output=True)
        if self.cfg.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def local_logits(self, input_ids):
        x = self.embed_tokens(input_ids)
        cos, sin = rotary_cos_sin(input_ids.shape[1], self.cfg.head_dim, theta=self.rope_theta, device=x.device,
                                  dtype=x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))

    def forward(self, input_ids):
        return gather_from_region(self.local_logits(input_ids), self.group)

    def loss(self, input_ids, labels, *, vocab_parallel=True):
        if vocab_parallel:
            return vocab_parallel_cross_entropy(self.local_logits(input_ids), labels, self.group)
        return lm_loss(self(input_ids), labels)
