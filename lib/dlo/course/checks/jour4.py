"""Checkers of the Jour 4 notebooks: ``llm_memory`` (Jour4/llm_memory.ipynb)."""
from __future__ import annotations

from typing import Callable

from dlo.course.checks.framework import expect, register
from dlo.models.config import LLAMA_3_2_3B, LLAMA_3_3_70B, TransformerConfig
from dlo.measure.memory import count_parameters
from dlo.measure.memory import per_gpu_memory

LLM_NB = "Jour4/llm_memory.ipynb"


@register("llm_memory", "gqa", ("attention_params",), LLM_NB)
def _check_gqa(attention_params: Callable) -> str:

    mha = TransformerConfig(vocab_size=10, hidden_size=64, intermediate_size=128, num_layers=1, num_heads=8,
                            num_kv_heads=8, name="MHA")
    for cfg in (LLAMA_3_2_3B, LLAMA_3_3_70B, mha):
        head_dim = cfg.head_dim or cfg.hidden_size // cfg.num_heads
        got = attention_params(cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, head_dim)
        want = count_parameters(cfg)["attention_per_layer"]
        why = ""
        if got == 4 * cfg.hidden_size * cfg.num_heads * head_dim != want:
            why = " -- k and v are counted at full width: they have num_kv_heads heads, not num_heads"
        elif got == 4 * cfg.hidden_size ** 2 != want:
            why = (" -- 4 * hidden²: q and o have num_heads * head_dim outputs (not always hidden), k and v "
                   "num_kv_heads * head_dim")
        expect(got == want, f"{cfg.name or 'config'} (hidden {cfg.hidden_size}, {cfg.num_heads} heads, "
                             f"{cfg.num_kv_heads} KV heads, head_dim {head_dim}): expected {want:,}, got {got!r}{why}")
    return "q and o full width, k and v shrunk by grouped-query attention"


@register("llm_memory", "zero", ("model_state_bytes",), LLM_NB)
def _check_zero(model_state_bytes: Callable) -> str:

    n = 3_212_749_824
    for strategy in ("ddp", "zero1", "zero2", "zero3"):
        for gpus in (1, 4, 64):
            got = model_state_bytes(n, gpus, strategy)
            want = per_gpu_memory(n, gpus, strategy=strategy, optimizer="adamw", precision="bf16_mixed")["model_states"]
            expect(isinstance(got, (int, float)) and abs(got - want) <= 1e-6 * want + 16,
                    f"{strategy} on {gpus} GPU(s): expected {want / 1e9:.2f} GB per GPU, got "
                    f"{got / 1e9 if isinstance(got, (int, float)) else got!r} GB (per parameter: 2 bytes of bf16 "
                    "weights, 2 of gradients, 12 of fp32 master weights and Adam moments = 16 bytes; zero1 shards "
                    "the 12, zero2 the gradients too, zero3 everything)")
    return "each ZeRO stage shards one more kind of model state; ZeRO-3 divides all 16 bytes/param"
