"""Correct, written another way: the blocks appended in a loop, the head tied by sharing the Parameter object, the
rotary tables built once per call from the config."""
import copy

from torch import nn

from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT

# everything else as in the reference tp_balises.py; only the part below is written another way
globals().update({k: v for k, v in load_exercises(ROOT / "tp_tensor_parallel" / "tp_balises.py").items()
                  if not k.startswith("__")})


_Reference = TPLlama


class TPLlama(_Reference):
    def __init__(self, full, group=None):
        nn.Module.__init__(self)
        self.cfg, self.group, self.rope_theta = full.cfg, group, full.rope_theta
        self.embed_tokens = VocabParallelEmbedding(full.embed_tokens, group)
        self.layers = nn.ModuleList()
        for block in full.layers:
            self.layers.append(TPDecoderBlock(block, group))
        self.norm = copy.deepcopy(full.norm)
        self.lm_head = ColumnParallelLinear(full.lm_head, group)
        if full.cfg.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def local_logits(self, input_ids):
        h = self.embed_tokens(input_ids)
        cos, sin = rotary_cos_sin(input_ids.shape[-1], self.cfg.head_dim, theta=self.rope_theta, device=h.device,
                                  dtype=h.dtype)
        for block in self.layers:
            h = block(h, cos, sin)
        return self.lm_head(self.norm(h))
