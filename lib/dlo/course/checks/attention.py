"""Checkers of tp_tensor_parallel/attention.ipynb (course ``attention``): choosing the SDPA backend.

``choose_sdpa_backends(case)`` gets a :class:`dlo.measure.attention.SDPACase` (device, dtype, head_dim, causal
flag, explicit mask, dropout, GPU compute capability) and returns ``(backends, reasons)``: the SDPA backends that
can run that call, in order of preference (``sdpa_kernel(backends, set_priority=True)`` then forces that
order), and, for each fused backend left out, why. The rules are the notebook's table (the main conditions of
PyTorch's dispatcher, simplified). GPU cases are simulated (the answer is compared with the table on cases no
CPU can run: bf16 on an H100, fp32 on an A100, a T4, a head_dim flash refuses, an explicit mask...); CPU cases
are also run for real: SDPA forced to the first backend returned must run and equal eager attention.

The cases vary what each mistake depends on: the CPU flash kernel has no head_dim limit but refuses dropout,
the CUDA kernels the other way round; an explicit mask rules out flash only on CUDA; fp32 rules out flash but
not the memory-efficient kernel; a GPU before Ampere has no flash kernel.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from dlo.course.checks.framework import CheckFailed, expect, register
from dlo.measure.attention import SDPACase

ATTENTION_NB = "tp_tensor_parallel/attention.ipynb"
FLASH, EFFICIENT, MATH = SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH
PREFERENCE = (FLASH, EFFICIENT, MATH)
#: Words that name each condition in a reason (one of them must appear, case insensitive).
WORDS = {
    "device": ("cuda", "cpu", "gpu"),
    "dtype": ("dtype", "float", "fp16", "fp32", "fp64", "bf16", "half", "precision"),
    "head_dim": ("head_dim", "head dim", "head size", "multiple", "256", "dimension", "alignment", "aligned"),
    "mask": ("mask",),
    "dropout": ("dropout",),
    "capability": ("capability", "sm80", "sm_80", "sm 80", "ampere", "arch", "8.0", "(8, 0)", "compute"),
}
_WHY = {
    "device": "it has no CPU kernel (CUDA only)",
    "dtype": "its kernel does not take this dtype",
    "head_dim": "its kernel does not take this head_dim",
    "mask": "the CUDA flash kernel takes no explicit attn_mask (is_causal only)",
    "dropout": "the CPU flash kernel does not apply dropout",
    "capability": "this GPU is older than what its kernel needs",
}


def refusals(case: SDPACase, backend: SDPBackend) -> list[str]:
    """The notebook's table: the conditions ``backend`` fails on ``case`` (empty: it can run it)."""
    if backend == MATH:
        return []
    half = case.dtype in (torch.float16, torch.bfloat16)
    if case.device == "cpu":
        if backend == EFFICIENT:
            return ["device"]
        out = [] if case.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64) else ["dtype"]
        return out + (["dropout"] if case.dropout_p > 0 else [])
    out = []
    if backend == FLASH:
        out += [] if case.capability >= (8, 0) else ["capability"]
        out += [] if half else ["dtype"]
        out += [] if case.head_dim % 8 == 0 and case.head_dim <= 256 else ["head_dim"]
        out += ["mask"] if case.has_mask else []
    else:
        out += [] if case.capability >= (5, 0) else ["capability"]
        out += [] if half or case.dtype == torch.float32 else ["dtype"]
        out += [] if case.head_dim % (8 if half else 4) == 0 else ["head_dim"]
    return out


def expected(case: SDPACase) -> list[SDPBackend]:
    return [b for b in PREFERENCE if not refusals(case, b)]


# (where, case): the simulated GPU cases, then the CPU ones (run for real too)
CASES = [
    ("cuda bf16, causal, head_dim 128, H100", SDPACase("cuda", torch.bfloat16, 128, is_causal=True, capability=(9, 0))),
    ("cuda fp32, causal, head_dim 64, A100", SDPACase("cuda", torch.float32, 64, is_causal=True, capability=(8, 0))),
    ("cuda bf16, explicit attn_mask, head_dim 64, H100", SDPACase("cuda", torch.bfloat16, 64, has_mask=True,
                                                                  capability=(9, 0))),
    ("cuda bf16, head_dim 320, A100", SDPACase("cuda", torch.bfloat16, 320, is_causal=True, capability=(8, 0))),
    ("cuda fp16, causal, head_dim 64, T4 (7.5)", SDPACase("cuda", torch.float16, 64, is_causal=True,
                                                          capability=(7, 5))),
    ("cuda bf16, causal, dropout 0.1, H100", SDPACase("cuda", torch.bfloat16, 128, is_causal=True, dropout_p=0.1,
                                                      capability=(9, 0))),
    ("cuda fp16, head_dim 100, A100", SDPACase("cuda", torch.float16, 100, capability=(8, 0))),
    ("cuda fp32, head_dim 36, A100", SDPACase("cuda", torch.float32, 36, capability=(8, 0))),
    ("cuda fp64, causal, head_dim 64, H100", SDPACase("cuda", torch.float64, 64, is_causal=True, capability=(9, 0))),
    ("cpu fp32, causal, head_dim 64", SDPACase("cpu", torch.float32, 64, is_causal=True)),
    ("cpu fp32, dropout 0.1, head_dim 64", SDPACase("cpu", torch.float32, 64, dropout_p=0.1)),
    ("cpu bf16, explicit attn_mask, head_dim 64", SDPACase("cpu", torch.bfloat16, 64, has_mask=True)),
    ("cpu fp32, causal, head_dim 300", SDPACase("cpu", torch.float32, 300, is_causal=True)),
]


def _call(choose: Callable, case: SDPACase, where: str) -> tuple[list[SDPBackend], dict]:
    result = choose(case)
    expect(isinstance(result, tuple) and len(result) == 2,
           f"{where}: return (backends, reasons): the backends to allow, in order, and a dict backend -> why not")
    backends, reasons = result
    expect(isinstance(backends, (list, tuple)) and all(isinstance(b, SDPBackend) for b in backends),
           f"{where}: the backends must be a list of torch.nn.attention.SDPBackend members, got {backends!r}")
    expect(isinstance(reasons, dict),
           f"{where}: reasons must be a dict SDPBackend -> str, got {type(reasons).__name__}")
    return list(backends), reasons


def _wrong_set(case: SDPACase, where: str, got: list[SDPBackend], want: list[SDPBackend]) -> None:
    extra = [b for b in got if b not in want]
    for b in extra:
        if b == SDPBackend.CUDNN_ATTENTION:
            raise CheckFailed(f"{where}: CUDNN_ATTENTION is not part of this choice (its conditions change with each "
                              "cuDNN release): choose among FLASH_ATTENTION, EFFICIENT_ATTENTION and MATH")
        why = refusals(case, b)
        raise CheckFailed(f"{where}: {b.name} cannot run this call: {_WHY[why[0]]}")
    missing = [b for b in want if b not in got]
    b = missing[0]
    if b == MATH:
        raise CheckFailed(f"{where}: MATH is missing: it runs every case and must always come last, as the fallback")
    if case.device == "cpu" and (case.head_dim % 8 or case.head_dim > 256):
        raise CheckFailed(f"{where}: {b.name} can run this call: the head_dim limit (a multiple of 8, at most 256) is "
                          "the CUDA flash kernel's; the CPU flash kernel has none")
    if case.device == "cuda" and case.dropout_p > 0:
        raise CheckFailed(f"{where}: {b.name} can run this call: only the CPU flash kernel refuses dropout; the CUDA "
                          "flash and memory-efficient kernels apply it")
    if case.device == "cpu" and case.has_mask:
        raise CheckFailed(f"{where}: {b.name} can run this call: the CPU flash kernel takes an explicit attn_mask "
                          "(only the CUDA flash kernel refuses one)")
    raise CheckFailed(f"{where}: {b.name} can run this call and was left out: expected {[x.name for x in want]}")


def _check_reasons(case: SDPACase, where: str, got: list[SDPBackend], reasons: dict) -> None:
    for b in (FLASH, EFFICIENT):
        if b in got:
            continue
        text = reasons.get(b)
        expect(isinstance(text, str) and text.strip() != "",
               f"{where}: {b.name} is left out but reasons gives no sentence for it: say why (reasons[{b}])")
        words = [w for cond in refusals(case, b) for w in WORDS[cond]]
        expect(any(w in text.lower() for w in words),
               f"{where}: the reason given for leaving {b.name} out ({text!r}) does not name what rules it out here: "
               f"{' and '.join(refusals(case, b))}")


def _run_for_real(case: SDPACase, backends: list[SDPBackend], where: str) -> None:
    """SDPA forced to the first backend returned runs this CPU case and equals eager attention."""
    g = torch.Generator().manual_seed(case.head_dim)
    q, k, v = (torch.randn(1, 2, 9, case.head_dim, generator=g).to(case.dtype) for _ in range(3))
    mask = torch.randn(9, 9, generator=g).to(case.dtype) if case.has_mask else None
    try:
        with sdpa_kernel(backends[:1]):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=case.is_causal,
                                                 dropout_p=case.dropout_p)
    except RuntimeError as exc:
        raise CheckFailed(f"{where}: SDPA forced to {backends[0].name} refused this call ({str(exc).splitlines()[0]}): "
                          "that backend cannot run it") from None
    if case.dropout_p > 0:
        return
    scores = q.double() @ k.double().transpose(-2, -1) / math.sqrt(case.head_dim)
    if mask is not None:
        scores = scores + mask.double()
    if case.is_causal:
        scores = scores.masked_fill(torch.ones(9, 9, dtype=torch.bool).triu(1), float("-inf"))
    want = torch.softmax(scores, -1) @ v.double()
    tol = 1e-4 if case.dtype == torch.float32 else 4e-2
    expect(bool(((out.double() - want).abs() <= tol).all()), f"{where}: SDPA under {backends[0].name} differs from "
           "eager attention")


@register("attention", "backend", ("choose_sdpa_backends",), ATTENTION_NB)
def _check_backend(choose_sdpa_backends: Callable) -> str:
    for where, case in CASES:
        got, reasons = _call(choose_sdpa_backends, case, where)
        want = expected(case)
        expect(len(set(got)) == len(got), f"{where}: each backend once, got {[b.name for b in got]}")
        if set(got) != set(want):
            _wrong_set(case, where, got, want)
        if got != want:
            raise CheckFailed(f"{where}: order the backends by preference -- {', '.join(b.name for b in want)}: the "
                              "fused kernels first, flash before memory-efficient, MATH last (sdpa_kernel(..., "
                              "set_priority=True) tries them in that order)")
        _check_reasons(case, where, got, reasons)
        if case.device == "cpu":
            _run_for_real(case, got, where)
    return (f"{len(CASES)} cases: the backends that can run each call, in order of preference, with a reason for each "
            "fused kernel left out; the CPU cases run for real under sdpa_kernel")
