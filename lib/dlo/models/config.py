"""Transformer shapes (Llama-style): the exact Llama 3.2 3B and 3.3 70B configurations and a tiny one.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

from dlo.runtime.validate import check_choice, positive_int


# ==================================================================================================
# Architecture
# ==================================================================================================

@dataclass(frozen=True)
class TransformerConfig:
    """The shape of a decoder-only transformer: everything its parameter count depends on.

    The main path is Llama-style: RMSNorm (one weight vector per norm, no bias), a SwiGLU MLP (three
    matrices gate/up/down, no bias), no bias in the attention projections, grouped-query attention
    (``num_kv_heads`` K/V heads shared by ``num_heads`` query heads). ``mlp="gelu"`` (two matrices, with
    ``mlp_bias`` for GPT-2-like models) and ``norm="layer"`` (weight and bias) exist so that one can see
    how little these choices change the total. Rotary embeddings, ``rope_theta``, context length, dropout
    have no parameters and are absent.

    ``head_dim`` defaults to ``hidden_size // num_heads``; Llama 3 gives it explicitly (128) and it may
    then differ from that ratio (the Q/K/V projections are ``hidden -> num_heads * head_dim``).
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int | None = None
    head_dim: int | None = None
    tie_embeddings: bool = False
    norm: str = "rms"
    mlp: str = "swiglu"
    attention_bias: bool = False
    mlp_bias: bool = False
    name: str = ""

    def __post_init__(self) -> None:
        for f in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads"):
            positive_int(f, getattr(self, f))
        if self.num_kv_heads is None:
            object.__setattr__(self, "num_kv_heads", self.num_heads)
        positive_int("num_kv_heads", self.num_kv_heads)
        if self.head_dim is None:
            if self.hidden_size % self.num_heads:
                raise ValueError(f"num_heads ({self.num_heads}) must divide hidden_size ({self.hidden_size}) "
                                 f"when head_dim is not given")
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        positive_int("head_dim", self.head_dim)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_kv_heads ({self.num_kv_heads}) must divide num_heads ({self.num_heads}): "
                             f"each K/V head is shared by a whole group of query heads")
        check_choice("norm", self.norm, ("rms", "layer"))
        check_choice("mlp", self.mlp, ("swiglu", "gelu"))

    # --- derived sizes -----------------------------------------------------------------------------
    @property
    def q_dim(self) -> int:
        """Width of the queries (and of the attention output): ``num_heads * head_dim``."""
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of the keys and of the values: ``num_kv_heads * head_dim`` (smaller than q_dim with GQA)."""
        return self.num_kv_heads * self.head_dim

    def replace(self, **changes: Any) -> "TransformerConfig":
        """A copy with some fields changed (``head_dim=None`` recomputes it from the new hidden size)."""
        return replace(self, **changes)

    # --- transformers interop -------------------------------------------------------------------------
    @classmethod
    def from_hf(cls, config: Any, name: str = "") -> "TransformerConfig":
        """From a transformers ``LlamaConfig`` (or any config / dict with the same field names: Mistral,
        Qwen2, ...). Fields absent from a dict take transformers' defaults for Llama."""
        d = config if isinstance(config, Mapping) else config.to_dict()
        missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                               "num_attention_heads") if k not in d]
        if missing:
            raise ValueError(f"config lacks {', '.join(missing)} (expected a LlamaConfig or its dict)")
        act = d.get("hidden_act", "silu")
        return cls(vocab_size=d["vocab_size"], hidden_size=d["hidden_size"],
                   intermediate_size=d["intermediate_size"], num_layers=d["num_hidden_layers"],
                   num_heads=d["num_attention_heads"], num_kv_heads=d.get("num_key_value_heads"),
                   head_dim=d.get("head_dim"), tie_embeddings=bool(d.get("tie_word_embeddings", False)),
                   mlp="swiglu" if act in ("silu", "swish") else "gelu",
                   attention_bias=bool(d.get("attention_bias", False)), mlp_bias=bool(d.get("mlp_bias", False)),
                   name=name or d.get("_name_or_path", "") or "")

    def to_hf(self, **overrides: Any):
        """A transformers ``LlamaConfig`` with these sizes (Llama-style configs only). Build the model on
        the meta device to count without allocating: ``with torch.device("meta"): LlamaForCausalLM(cfg)``."""
        if self.norm != "rms" or self.mlp != "swiglu":
            raise ValueError(f"to_hf builds a LlamaConfig, which needs norm='rms' and mlp='swiglu' "
                             f"(got norm={self.norm!r}, mlp={self.mlp!r})")
        from transformers import LlamaConfig

        kwargs = dict(vocab_size=self.vocab_size, hidden_size=self.hidden_size,
                      intermediate_size=self.intermediate_size, num_hidden_layers=self.num_layers,
                      num_attention_heads=self.num_heads, num_key_value_heads=self.num_kv_heads,
                      head_dim=self.head_dim, tie_word_embeddings=self.tie_embeddings,
                      attention_bias=self.attention_bias, mlp_bias=self.mlp_bias)
        kwargs.update(overrides)
        return LlamaConfig(**kwargs)


#: Llama 3.2 3B (meta-llama/Llama-3.2-3B): tied input/output embeddings.
LLAMA_3_2_3B = TransformerConfig(vocab_size=128256, hidden_size=3072, intermediate_size=8192, num_layers=28,
                                 num_heads=24, num_kv_heads=8, head_dim=128, tie_embeddings=True,
                                 name="Llama 3.2 3B")
#: Llama 3.3 70B (meta-llama/Llama-3.3-70B-Instruct): separate embedding and LM head.
LLAMA_3_3_70B = TransformerConfig(vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_layers=80,
                                  num_heads=64, num_kv_heads=8, head_dim=128, tie_embeddings=False,
                                  name="Llama 3.3 70B")
#: A 31.6 M-parameter Llama for CPU tests and smoke runs: big enough for weights, gradients and AdamW
#: states (~0.5 GB in fp32) to dominate a memory measurement, small enough for a training step in ~1 s.
TINY_LLAMA = TransformerConfig(vocab_size=8192, hidden_size=512, intermediate_size=1376, num_layers=8,
                               num_heads=8, num_kv_heads=4, tie_embeddings=False, name="tiny Llama")
