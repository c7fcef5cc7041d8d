"""Checkers of tp_tensor_parallel/context_parallel.ipynb (course ``context``): the online-softmax merge.

``merge_partial(out_a, lse_a, out_b, lse_b)`` gets the attention of the same queries over two disjoint key
sets and must return the attention over their union. The inputs are real partial attentions (random queries,
keys and values, the keys split in two at random), so the expected answer is the softmax over the
concatenated keys; they are chosen so that each common mistake changes the result: the two lse differ by
about 1 (the max is far from the log-sum-exp), the scores reach a few hundred in float32 (``exp(lse)``
overflows), one case has one head and as many queries as head dimensions (a weight that does not broadcast along the head
dimension silently multiplies the wrong axis), one part is empty (every key masked: ``lse = -inf``), and the
output is merged again with a third part (a wrong lse spoils the next merge).
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from dlo.course.checks.framework import CheckFailed, expect, register

CONTEXT_NB = "tp_tensor_parallel/context_parallel.ipynb"


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, -1)
    probs = torch.exp(scores - torch.where(torch.isinf(lse), torch.zeros_like(lse), lse).unsqueeze(-1))
    return probs @ v, lse


def _case(g: torch.Generator, shape: tuple[int, int, int, int], scale: float, empty_rows: bool = False):
    """Two partial attentions of the same queries (float64) and the attention over all the keys."""
    b, h, s, d = shape
    la, lb = int(torch.randint(2, 7, (1,), generator=g)), int(torch.randint(2, 7, (1,), generator=g))
    q = torch.randn(b, h, s, d, generator=g, dtype=torch.float64) * scale
    k = torch.randn(b, h, la + lb, d, generator=g, dtype=torch.float64)
    v = torch.randn(b, h, la + lb, d, generator=g, dtype=torch.float64)
    mask_b = None
    if empty_rows:  # the first queries see none of b's keys (a fully masked block): lse_b = -inf there
        mask_b = torch.ones(s, lb, dtype=torch.bool)
        mask_b[: s // 2] = False
    a = _attention(q, k[..., :la, :], v[..., :la, :])
    bb = _attention(q, k[..., la:, :], v[..., la:, :], mask_b)
    mask = None if mask_b is None else torch.cat([torch.ones(s, la, dtype=torch.bool), mask_b], 1)
    return a, bb, _attention(q, k, v, mask)


def _reference(out_a, lse_a, out_b, lse_b):
    lse = torch.logaddexp(lse_a, lse_b)
    return torch.exp(lse_a - lse).unsqueeze(-1) * out_a + torch.exp(lse_b - lse).unsqueeze(-1) * out_b, lse


def _close(got: torch.Tensor, want: torch.Tensor, tol: float) -> bool:
    return got.shape == want.shape and bool(torch.isfinite(got).all()) and \
        bool(((got.double() - want.double()).abs() <= tol * (1 + want.double().abs())).all())


def _call(merge_partial: Callable, args: list[torch.Tensor], where: str):
    try:
        result = merge_partial(*args)
    except NotImplementedError:
        raise
    except (RuntimeError, IndexError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CheckFailed(f"{where}: it raised {type(exc).__name__}: {first[:160]} -- lse is [..., seq] and out is "
                          "[..., seq, head_dim]: broadcast the weights with lse[..., None]") from None
    expect(isinstance(result, tuple) and len(result) == 2 and all(isinstance(t, torch.Tensor) for t in result),
           f"{where}: return (out, lse), two tensors")
    return result


def _diagnose(where: str, args, out, lse, want_out, want_lse, tol: float) -> None:
    out_a, lse_a, out_b, lse_b = args
    dt = out_a.dtype
    big = float(torch.maximum(lse_a, lse_b).abs().max()) if torch.isfinite(torch.maximum(lse_a, lse_b)).any() else 0
    expect(out.shape == want_out.shape and lse.shape == want_lse.shape,
           f"{where}: out must keep the shape {tuple(want_out.shape)} and lse {tuple(want_lse.shape)}, got "
           f"{tuple(out.shape)} and {tuple(lse.shape)}")
    expect(out.dtype == dt and lse.dtype == dt, f"{where}: keep the inputs' dtype {dt}, got {out.dtype} / {lse.dtype}")
    if not (torch.isfinite(out).all() and torch.isfinite(lse[torch.isfinite(want_lse)]).all()):
        if bool((lse_b == float("-inf")).any()) and big < 80:
            raise CheckFailed(f"{where}: NaN or inf when one part is empty (every key masked: lse_b = -inf, out_b = 0): "
                              "the merged result must then be part a alone (torch.logaddexp handles -inf)")
        raise CheckFailed(f"{where}: inf or NaN with scores around {big:.0f}: exp(lse) overflows {dt} (above about "
                          f"{math.log(torch.finfo(dt).max):.0f}): subtract the max before exp, or use torch.logaddexp")
    if not _close(lse, want_lse, tol):
        if _close(lse, torch.maximum(lse_a, lse_b), tol):
            raise CheckFailed(f"{where}: the merged lse is the max of lse_a and lse_b; it must be the log-sum-exp "
                              "log(exp(lse_a) + exp(lse_b)): both parts add to the softmax's denominator")
        if _close(lse, want_lse - torch.maximum(lse_a, lse_b), tol):
            raise CheckFailed(f"{where}: the merged lse lacks the max you subtracted: lse = m + log(exp(lse_a - m) + "
                              "exp(lse_b - m)), with m added back")
        if _close(out, want_out, tol):
            raise CheckFailed(f"{where}: out is right but the returned lse is not log(exp(lse_a) + exp(lse_b)): the "
                              "next merge (the ring's next block) needs the lse of the union")
        raise CheckFailed(f"{where}: the merged lse differs from log(exp(lse_a) + exp(lse_b)) (the log-sum-exp of "
                          "all the scores): max error " f"{float((lse - want_lse).abs().max()):.3g}")
    if not _close(out, want_out, tol):
        m = torch.maximum(lse_a, lse_b)
        ea, eb = torch.exp(lse_a - m).unsqueeze(-1), torch.exp(lse_b - m).unsqueeze(-1)
        wa, wb = torch.exp(lse_a - want_lse), torch.exp(lse_b - want_lse)
        candidates = [
            (ea * out_a + eb * out_b, "the weights are not renormalised: exp(lse_a - m) and exp(lse_b - m) do not sum "
                                      "to 1; use exp(lse_a - lse) and exp(lse_b - lse) with the merged lse"),
            ((out_a + out_b) / 2, "you averaged the two outputs: weight each by its share of the softmax, "
                                  "exp(lse_part - lse)"),
            (torch.where((lse_a >= lse_b).unsqueeze(-1), out_a, out_b),
             "you kept the part with the larger lse only: both parts contribute, weighted by exp(lse_part - lse)"),
            (wb.unsqueeze(-1) * out_a + wa.unsqueeze(-1) * out_b,
             "the weights are swapped: out_a is weighted by exp(lse_a - lse), out_b by exp(lse_b - lse)"),
        ]
        if out_a.shape[:-1] == (1,) * (out_a.dim() - 2) + out_a.shape[-1:]:  # [1, 1, s] * [1, 1, s, s] broadcasts
            candidates.append((wa * out_a + wb * out_b,
                               "the weights are multiplied along the wrong axis: lse is [..., seq], out is [..., seq, "
                               "head_dim]; broadcast with lse[..., None] (unsqueeze(-1))"))
        for wrong, why in candidates:
            if _close(out, wrong, tol):
                raise CheckFailed(f"{where}: {why}")
        raise CheckFailed(f"{where}: out differs from the attention over all the keys (max error "
                          f"{float((out - want_out).abs().max()):.3g}): out = exp(lse_a - lse) * out_a + "
                          "exp(lse_b - lse) * out_b")


@register("context", "merge", ("merge_partial",), CONTEXT_NB)
def _check_merge(merge_partial: Callable) -> str:
    g = torch.Generator().manual_seed(0)
    cases = [  # (where, shape [batch, heads, seq, head_dim], query scale, dtype, tolerance, a part empty)
        ("float64, seq == head_dim, 1 head", (1, 1, 8, 8), 1.0, torch.float64, 1e-12, False),
        ("float32, 3 heads", (1, 3, 7, 16), 2.0, torch.float32, 2e-6, False),
        ("float32, one part fully masked for half the queries", (1, 2, 6, 4), 1.0, torch.float32, 2e-6, True),
        ("float32, scores of a few hundred", (1, 2, 6, 8), 120.0, torch.float32, 2e-6, False),
    ]
    for where, shape, scale, dtype, tol, empty in cases:
        (oa, la), (ob, lb), (want_out, want_lse) = _case(g, shape, scale, empty)
        args = [t.to(dtype) for t in (oa, la, ob, lb)]
        # the exact merge of the rounded inputs (float32 lse of ~500 carry an error of ~1e-5 themselves)
        want_out, want_lse = _reference(*(t.double() for t in args)) if dtype != torch.float64 else (want_out, want_lse)
        tol_here = tol * (1 + (float(torch.nan_to_num(want_lse.abs(), posinf=0).max()) if scale > 10 else 0))
        copies = [t.clone() for t in args]
        out, lse = _call(merge_partial, copies, where)
        expect(all(torch.equal(a, b) for a, b in zip(copies, args)),
               f"{where}: do not modify the inputs in place: return new tensors")
        _diagnose(where, args, out, lse, want_out.to(torch.float64), want_lse.to(torch.float64), tol_here)
    # associativity: (a ∪ b) ∪ c, with the lse the student returned, equals the attention over all three
    q = torch.randn(2, 2, 5, 8, generator=g, dtype=torch.float64)
    k = torch.randn(2, 2, 12, 8, generator=g, dtype=torch.float64)
    v = torch.randn(2, 2, 12, 8, generator=g, dtype=torch.float64)
    parts = [_attention(q, k[..., s, :], v[..., s, :]) for s in (slice(0, 3), slice(3, 7), slice(7, 12))]
    acc = parts[0]
    for part in parts[1:]:
        acc = _call(merge_partial, [*acc, *part], "three blocks one after another")
    want_out, want_lse = _attention(q, k, v)
    expect(_close(acc[0], want_out, 1e-12) and _close(acc[1], want_lse, 1e-12),
           "three blocks merged one after another differ from the attention over all the keys: the lse you return "
           "must be that of the union, since the next merge uses it")
    return ("out = exp(lse_a - lse) out_a + exp(lse_b - lse) out_b with lse = logaddexp(lse_a, lse_b): exact in "
            "float32 and float64, no overflow at large scores, an empty part ignored, blocks merged in a chain")
