"""Checkers of the Jour 4 notebooks: ``llm_memory`` (Jour4/llm_memory.ipynb)."""
from __future__ import annotations

import random
from typing import Callable

from dlo.course.checks.cases import Case, seeded
from dlo.course.checks.framework import CheckFailed, expect, register
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


def _gqa_configs() -> list[TransformerConfig]:
    """Llama 3's two sizes, then seeded configs: KV heads = 1, = num_heads and in between (a divisor), head_dim
    equal to hidden / num_heads or not, all sizes distinct."""
    def draw(rng: random.Random) -> Case:
        nkv = rng.choice([1, 2, 3, 4])
        nh = nkv * rng.choice([1, 2, 3, 5])
        hd = rng.choice([8, 11, 16, 24])
        hidden = rng.choice([nh * hd, nh * hd + rng.randint(1, 40)])
        cfg = TransformerConfig(vocab_size=10, hidden_size=hidden, intermediate_size=128, num_layers=1, num_heads=nh,
                                num_kv_heads=nkv, head_dim=hd, name="generated")
        return Case("", {"cfg": cfg}, size=hidden)

    fixed = [TransformerConfig(vocab_size=10, hidden_size=64, intermediate_size=128, num_layers=1, num_heads=8,
                               num_kv_heads=8, name="MHA"),
             TransformerConfig(vocab_size=10, hidden_size=105, intermediate_size=128, num_layers=1, num_heads=15,
                               num_kv_heads=3, head_dim=11, name="odd GQA"),
             TransformerConfig(vocab_size=10, hidden_size=96, intermediate_size=128, num_layers=1, num_heads=6,
                               num_kv_heads=1, name="MQA")]
    drawn = [c.kwargs["cfg"] for c in seeded(draw, 8, seed=5)]
    return [LLAMA_3_2_3B, LLAMA_3_3_70B, *fixed, *drawn]


@register("llm_memory", "gqa", ("attention_params",), LLM_NB)
def _check_gqa(attention_params: Callable) -> str:
    configs = _gqa_configs()
    shape = lambda c: (c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim or c.hidden_size // c.num_heads)  # noqa
    got = [attention_params(*shape(cfg)) for cfg in configs]
    for cfg, value in zip(configs, got):
        want = count_parameters(cfg)["attention_per_layer"]
        if value == want:
            continue
        mistakes = [_gqa_mistakes(*shape(c)) for c in configs]
        why = next((f" -- {m}" for m in mistakes[0] if all(v == ms[m] for v, ms in zip(got, mistakes))), "")
        h, nh, nkv, hd = shape(cfg)
        raise CheckFailed(f"{cfg.name or 'config'} (hidden {h}, {nh} heads, {nkv} KV heads, head_dim {hd}): expected "
                          f"{want:,} (q and o: hidden × num_heads · head_dim each, k and v: hidden × num_kv_heads · "
                          f"head_dim each), got {value!r}{why}")
    return f"q and o full width, k and v shrunk by grouped-query attention ({len(configs)} configs, 1 KV head to MHA)"


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

    cases = [(n, gpus, strategy) for n in (1, 7, 1_234_567, 3_212_749_824) for strategy in ("ddp", "zero1", "zero2", "zero3")
             for gpus in (1, 2, 3, 4, 7, 64, 1000)]
    got = {case: model_state_bytes(*case) for case in cases}
    close = lambda a, b: isinstance(a, (int, float)) and abs(a - b) <= 1e-9 * b + 5  # noqa: E731 - 5 ceilings
    for n, gpus, strategy in cases:
        value = got[n, gpus, strategy]
        want = per_gpu_memory(n, gpus, strategy=strategy, optimizer="adamw", precision="bf16_mixed")["model_states"]
        if close(value, want):
            continue
        same = [c for c in cases if c[2] == strategy]  # a mistake is named when its formula holds on all of them
        why = next((m for i, (m, _) in enumerate(_zero_mistakes(n, gpus, strategy))
                    if all(close(got[c], _zero_mistakes(*c)[i][1]) for c in same)),
                   "per parameter: 2 bytes of bf16 weights, 2 of gradients, 12 of fp32 master weights and Adam "
                   "moments = 16 bytes; zero1 shards the 12, zero2 the gradients too, zero3 everything")
        raise CheckFailed(f"{strategy} on {gpus} GPU(s), {n:,} parameters: expected {want:,} bytes per GPU, got "
                          f"{value!r} -- {why}")
    for unknown in ("zero4", "fsdp2", "ZeRO-2"):
        try:
            got = model_state_bytes(1_000, 4, unknown)
        except Exception:  # noqa: BLE001 - any error is a refusal
            continue
        raise CheckFailed(f"an unknown strategy {unknown!r} gave {got!r}: raise an error (ValueError) for a name "
                          "other than ddp, zero1, zero2, zero3 instead of answering for another strategy")
    return "each ZeRO stage shards one more kind of model state; ZeRO-3 divides all 16 bytes/param"
