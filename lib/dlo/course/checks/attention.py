"""Checkers of tp_tensor_parallel/attention.ipynb (course ``attention``): choosing the SDPA backend.

``choose_sdpa_backends(case)`` gets a :class:`dlo.measure.attention.SDPACase` (device, dtype, head_dim, causal
flag, explicit mask, dropout, GPU compute capability) and returns ``(backends, reasons)``: the SDPA backends that
can run that call, in order of preference (``sdpa_kernel(backends, set_priority=True)`` then forces that
order), and, for each fused backend left out, why. The rules are the notebook's table (the main conditions of
PyTorch's dispatcher, simplified).

The answer is compared with the table on generated cases (:func:`generated_cases`): every combination of compute
capabilities on both sides of 5.0 and 8.0 (3.7, 5.0, 7.5, 8.0, 8.6, 9.0), head_dims on both sides of each rule
(multiples of 4 but not 8, multiples of 8 up to 256 and 256 itself, 264 and 320 beyond), the four dtypes, and each
flag (causal, explicit mask, dropout) off and on, on CUDA (simulated: no GPU needed) and on a CPU (some also run for
real: SDPA forced to the first backend returned must run and equal eager attention). The cases are tried from the
smallest to the most involved, so a failure names the smallest one. Where a backend is left out that the table
accepts, the condition to blame is found on twin cases (the same case with one condition changed) before it is named.
"""
from __future__ import annotations

import dataclasses
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


#: The values each condition of the table is tried at, on both sides of every threshold: compute capability below
#: and at 5.0 and 8.0 (and a T4's 7.5, an A100's 8.6, an H100's 9.0); head_dim multiples of 4 but not 8 (12, 36, 100,
#: 252), of 8 up to 256 (8, 64, 248, 256) and beyond (264, 320), 4 and 2 at the small end; the four dtypes; and each
#: flag (causal, an explicit mask, dropout) off and on.
CAPABILITIES = ((9, 0), (8, 6), (8, 0), (7, 5), (5, 0), (3, 7))
HEAD_DIMS = (2, 4, 8, 12, 36, 64, 100, 248, 252, 256, 264, 320)
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
#: (is_causal, has_mask, dropout_p): no flag first, then one, then dropout with causal or a mask
FLAGS = ((False, False, 0.0), (True, False, 0.0), (False, True, 0.0), (False, False, 0.1), (True, False, 0.1),
         (False, True, 0.1))
#: head_dims the CPU cases also run at for real (SDPA forced to the first backend returned)
RUN_HEAD_DIMS = (4, 36, 64, 264)
_DT_NAME = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.float64: "fp64"}


def describe(case: SDPACase) -> str:
    """A case in words: ``cuda fp16, head_dim 256, capability (8, 0), is_causal, dropout 0.1``."""
    parts = [f"{case.device} {_DT_NAME.get(case.dtype, case.dtype)}", f"head_dim {case.head_dim}"]
    parts += [f"capability {case.capability}"] if case.capability else []
    parts += ["is_causal"] if case.is_causal else []
    parts += ["an explicit attn_mask"] if case.has_mask else []
    parts += [f"dropout {case.dropout_p}"] if case.dropout_p else []
    return ", ".join(parts)


def generated_cases() -> list[SDPACase]:
    """Every combination of the values above (CUDA and CPU), from the smallest case to the most involved: fewer flags
    first, then the smaller head_dim, the narrower dtype, the newer GPU. The first one an answer fails is named."""
    cases = [SDPACase("cuda", dt, d, c, m, p, cap) for cap in CAPABILITIES for dt in DTYPES for d in HEAD_DIMS
             for c, m, p in FLAGS]
    cases += [SDPACase("cpu", dt, d, c, m, p) for dt in DTYPES for d in HEAD_DIMS for c, m, p in FLAGS]

    def size(case: SDPACase):
        flags = int(case.is_causal) + int(case.has_mask) + int(case.dropout_p > 0)
        cap = CAPABILITIES.index(case.capability) if case.capability else -1
        return flags, case.head_dim, DTYPES.index(case.dtype), cap, case.device

    return sorted(cases, key=size)


CASES = generated_cases()

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


#: What the table says about a condition that does NOT rule ``backend`` out on ``device``: said once a twin case
#: has shown that this condition is what made the answer leave the backend out.
_ACCEPTS = {
    ("cpu", "FLASH_ATTENTION", "head_dim"): "the head_dim limit (a multiple of 8, at most 256) is the CUDA flash "
                                            "kernel's; the CPU flash kernel has none",
    ("cpu", "FLASH_ATTENTION", "dtype"): "the CPU flash kernel takes fp16, bf16, fp32 and fp64",
    ("cpu", "FLASH_ATTENTION", "has_mask"): "the CPU flash kernel takes an explicit attn_mask (only the CUDA flash "
                                            "kernel refuses one)",
    ("cuda", "FLASH_ATTENTION", "head_dim"): "the CUDA flash kernel takes any multiple of 8 up to 256, 256 included",
    ("cuda", "FLASH_ATTENTION", "dtype"): "the CUDA flash kernel takes fp16 and bf16",
    ("cuda", "FLASH_ATTENTION", "capability"): "the CUDA flash kernel runs from compute capability 8.0 (Ampere) on, "
                                               "8.0 included",
    ("cuda", "EFFICIENT_ATTENTION", "head_dim"): "the memory-efficient kernel takes a multiple of 8 in fp16/bf16, of "
                                                 "4 in fp32, with no upper limit",
    ("cuda", "EFFICIENT_ATTENTION", "dtype"): "the memory-efficient kernel takes fp16, bf16 and fp32",
    ("cuda", "EFFICIENT_ATTENTION", "capability"): "the memory-efficient kernel runs from compute capability 5.0 on, "
                                                   "5.0 included",
    ("cuda", "EFFICIENT_ATTENTION", "has_mask"): "the memory-efficient kernel takes an explicit attn_mask",
}
#: The value each condition is set to in a twin case (several: the first the table also accepts is used).
_NEUTRAL = {"head_dim": (64,), "dtype": (torch.bfloat16, torch.float16, torch.float32), "capability": ((9, 0),),
            "has_mask": (False,), "dropout_p": (0.0,), "is_causal": (False, True)}


def _cause(choose: Callable, case: SDPACase, backend: SDPBackend) -> tuple[str, object] | None:
    """The one condition whose change alone makes the answer keep ``backend`` (which the table accepts on ``case``
    and the answer left out), with the value that does: found on twin cases, not guessed."""
    found = []
    for name, values in _NEUTRAL.items():
        if name == "capability" and case.device == "cpu":
            continue
        for value in values:
            if getattr(case, name) == value:
                continue
            try:
                twin = dataclasses.replace(case, **{name: value})
            except ValueError:
                continue
            if refusals(twin, backend):
                continue
            try:
                backends = choose(twin)[0]
            except Exception:  # noqa: BLE001 - the twin only helps to name the cause
                break
            if backend in list(backends):
                found.append((name, value))
            break
    return found[0] if len(found) == 1 else None


def _wrong_set(choose: Callable, case: SDPACase, where: str, got: list[SDPBackend], want: list[SDPBackend]) -> None:
    extra = [b for b in got if b not in want]
    for b in extra:
        if b == SDPBackend.CUDNN_ATTENTION:
            raise CheckFailed(f"{where}: CUDNN_ATTENTION is not part of this choice (its conditions change with each "
                              "cuDNN release): choose among FLASH_ATTENTION, EFFICIENT_ATTENTION and MATH")
        why = refusals(case, b)
        raise CheckFailed(f"{where}: {b.name} cannot run this call: {'; '.join(_WHY[w] for w in why)}")
    missing = [b for b in want if b not in got]
    b = missing[0]
    if b == MATH:
        raise CheckFailed(f"{where}: MATH is missing: it runs every case and must always come last, as the fallback")
    if case.device == "cuda" and case.dropout_p > 0 and b in choose(dataclasses.replace(case, dropout_p=0.0))[0]:
        raise CheckFailed(f"{where}: {b.name} can run this call: only the CPU flash kernel refuses dropout; the CUDA "
                          "flash and memory-efficient kernels apply it")
    cause = _cause(choose, case, b)
    expected_names = [x.name for x in want]
    if cause is not None:
        name, value = cause
        shown = _DT_NAME.get(value, value) if name == "dtype" else value
        fact = _ACCEPTS.get((case.device, b.name, name), "is_causal rules no kernel out in the table" if
                            name == "is_causal" else f"{name} does not rule {b.name} out in the table")
        raise CheckFailed(f"{where}: {b.name} can run this call and was left out (expected {expected_names}); your "
                          f"answer keeps it once {name} is {shown}: {fact}")
    raise CheckFailed(f"{where}: {b.name} can run this call and was left out: expected {expected_names}, got "
                      f"{[x.name for x in got]}")


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
    for case in CASES:
        where = f"with {describe(case)}"
        got, reasons = _call(choose_sdpa_backends, case, where)
        want = expected(case)
        expect(len(set(got)) == len(got), f"{where}: each backend once, got {[b.name for b in got]}")
        if set(got) != set(want):
            _wrong_set(choose_sdpa_backends, case, where, got, want)
        if got != want:
            raise CheckFailed(f"{where}: order the backends by preference -- {', '.join(b.name for b in want)}: the "
                              "fused kernels first, flash before memory-efficient, MATH last (sdpa_kernel(..., "
                              "set_priority=True) tries them in that order)")
        _check_reasons(case, where, got, reasons)
        if case.device == "cpu" and case.head_dim in RUN_HEAD_DIMS:
            _run_for_real(case, got, where)
    return (f"{len(CASES)} generated cases, each condition of the table on both sides of its threshold: the backends "
            "that can run each call, in order of preference, with a reason for each fused kernel left out; CPU cases "
            "run for real under sdpa_kernel")
