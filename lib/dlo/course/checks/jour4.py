"""Checkers of the Jour 4 notebooks: ``llm_memory`` (Jour4/llm_memory.ipynb)."""
from __future__ import annotations

from typing import Callable

from dlo.course.checks.framework import expect, register
from dlo.models.config import LLAMA_3_2_3B, LLAMA_3_3_70B, TransformerConfig
from dlo.measure.memory import count_parameters
from dlo.measure.memory import per_gpu_memory

LLM_NB = "Jour4/llm_memory.ipynb"


def _gqa_mistakes(h: int, nh: int, nkv: int, hd: int) -> dict[str, int]:
    """What common wrong formulas give on one config, each with the sentence that names the mistake."""
    q = o = h * nh * hd
    k = v = h * nkv * hd
    return {
        "k and v are counted at full width: they have num_kv_heads heads, not num_heads": 4 * h * nh * hd,
        "4 * hidden²: q and o have num_heads * head_dim outputs (not always hidden), k and v num_kv_heads * head_dim":
            4 * h * h,
        "head_dim is given (the same for every head): k and v have num_kv_heads heads of head_dim each, not heads of "
        "hidden / num_kv_heads": q + o + 2 * h * nkv * (h // nkv),
        "Llama's q/k/v/o projections have no bias: count the weight matrices only":
            q + k + v + o + nh * hd + 2 * nkv * hd + h,
        "the output projection o_proj (num_heads * head_dim -> hidden) is missing": q + k + v,
    }


@register("llm_memory", "gqa", ("attention_params",), LLM_NB)
def _check_gqa(attention_params: Callable) -> str:

    mha = TransformerConfig(vocab_size=10, hidden_size=64, intermediate_size=128, num_layers=1, num_heads=8,
                            num_kv_heads=8, name="MHA")
    # Odd sizes, and a head_dim that is not hidden / num_heads: formulas right only on round numbers differ here.
    odd = TransformerConfig(vocab_size=10, hidden_size=105, intermediate_size=128, num_layers=1, num_heads=15,
                            num_kv_heads=3, head_dim=11, name="odd GQA")
    mqa = TransformerConfig(vocab_size=10, hidden_size=96, intermediate_size=128, num_layers=1, num_heads=6,
                            num_kv_heads=1, name="MQA")
    for cfg in (LLAMA_3_2_3B, LLAMA_3_3_70B, mha, odd, mqa):
        head_dim = cfg.head_dim or cfg.hidden_size // cfg.num_heads
        got = attention_params(cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, head_dim)
        want = count_parameters(cfg)["attention_per_layer"]
        why = ""
        if got != want:
            why = next((f" -- {m}" for m, v in _gqa_mistakes(cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads,
                                                             head_dim).items() if got == v != want), "")
        expect(got == want, f"{cfg.name or 'config'} (hidden {cfg.hidden_size}, {cfg.num_heads} heads, "
                             f"{cfg.num_kv_heads} KV heads, head_dim {head_dim}): expected {want:,}, got {got!r}{why}")
    return "q and o full width, k and v shrunk by grouped-query attention"


def _zero_mistakes(n: int, g: int, strategy: str) -> list[tuple[str, float]]:
    """Wrong per-GPU byte counts for one strategy, each with the sentence that names the mistake."""
    right = {"ddp": 16 * n, "zero1": 4 * n + 12 * n / g, "zero2": 2 * n + 14 * n / g, "zero3": 16 * n / g}
    twelve = {"ddp": 12 * n, "zero1": 12 * n / g, "zero2": 12 * n / g, "zero3": 12 * n / g}
    twelve_msg = ("you count 12 bytes per parameter: with bf16 mixed precision it is 16 bytes (2 of bf16 weights and 2 "
                  "of gradients on top of the 12 of fp32 master weights and Adam moments)")
    out = [(twelve_msg, twelve[strategy]), (twelve_msg, 12 * right[strategy] / 16)]
    fp32_grads = {"ddp": 18 * n, "zero1": 6 * n + 12 * n / g, "zero2": 2 * n + 16 * n / g, "zero3": 18 * n / g}
    out.append(("you count the gradients at 4 bytes (float32): with bf16 mixed precision they are bf16, 2 bytes "
                "each (only the master weights and Adam moments are float32)", fp32_grads[strategy]))
    if strategy == "zero1":
        out.append(("zero1 shards the optimizer states only (12 bytes/param): the bf16 weights and gradients stay "
                    "whole on every GPU", 16 * n / g))
        out.append(("zero1 shards the optimizer states only: the gradients are sharded from zero2 on", right["zero2"]))
    if strategy == "zero2":
        out.append(("zero2 shards the optimizer states and the gradients, not the bf16 weights: only zero3 shards "
                    "the weights", 16 * n / g))
        out.append(("zero2 shards the gradients too (2 bytes/param), not only the optimizer states", right["zero1"]))
    if strategy == "zero3":
        out.append(("zero3 shards the bf16 weights too: all 16 bytes/param are divided", right["zero2"]))
    if strategy == "ddp":
        out.append(("ddp replicates everything: all 16 bytes/param on every GPU, nothing divided", 16 * n / g))
    return out


@register("llm_memory", "zero", ("model_state_bytes",), LLM_NB)
def _check_zero(model_state_bytes: Callable) -> str:

    for n in (3_212_749_824, 1_234_567):
        for strategy in ("ddp", "zero1", "zero2", "zero3"):
            for gpus in (1, 3, 4, 64):
                got = model_state_bytes(n, gpus, strategy)
                want = per_gpu_memory(n, gpus, strategy=strategy, optimizer="adamw",
                                      precision="bf16_mixed")["model_states"]
                ok = isinstance(got, (int, float)) and abs(got - want) <= 1e-6 * want + 16
                why = ("per parameter: 2 bytes of bf16 weights, 2 of gradients, 12 of fp32 master weights and Adam "
                       "moments = 16 bytes; zero1 shards the 12, zero2 the gradients too, zero3 everything")
                if not ok and isinstance(got, (int, float)):
                    why = next((m for m, v in _zero_mistakes(n, gpus, strategy)
                                if abs(got - v) <= 1e-6 * v + 16 and abs(v - want) > 16), why)
                expect(ok, f"{strategy} on {gpus} GPU(s), {n:,} parameters: expected {want / 1e9:.4g} GB per GPU, got "
                           f"{got / 1e9 if isinstance(got, (int, float)) else got!r} GB -- {why}")
    return "each ZeRO stage shards one more kind of model state; ZeRO-3 divides all 16 bytes/param"
