"""Checkers of tp_tensor_parallel/context_parallel.ipynb (course ``context``): the online-softmax merge, and one
step of ring attention with its causal skip.

``merge_partial(out_a, lse_a, out_b, lse_b)`` gets the attention of the same queries over two disjoint key sets
and must return the attention over their union. The inputs are real partial attentions (random queries, keys and
values, the keys split in two at random), so the expected answer is the softmax over the concatenated keys; they
vary what each common mistake depends on: the two lse differ by about 1 (the max is far from the log-sum-exp);
each side in turn fully masked for some queries (``lse = -inf`` there: the other side must come out exactly);
scores of a few hundred in float32 (a plain exponential overflows); every score shifted far below zero, by -120 in
float32 and -800 in float64 (a plain exponential underflows to 0, even after a cast to float64); one head with as
many queries as head dimensions (a weight that does not broadcast along the head dimension multiplies the wrong
axis silently); a chain of three merges (a wrong lse spoils the next one).

Beyond these fixed cases, :func:`generated_merge_cases` draws seeded cases over the dtype (fp64, fp32, bf16), batch,
heads, odd and even query counts, head_dim, score scale and shift, and a side empty or not; the gradients of the
merge with respect to its four inputs are compared with the reference's as well as its values.

``ring_step`` is checked on one query chunk against one key chunk of each kind, then over whole simulated rings
(:func:`generated_ring_cases`: cp = 2, 3, 4, both layouts, odd chunk lengths, heads, head_dim, fp64 / fp32 / bf16),
values and gradients (q, k, v) compared with causal attention over the whole sequence. The exercise is causal by
construction and takes K/V with the query's heads (grouped-query K/V are repeated before it is called).
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from dlo.course.checks.framework import CheckFailed, expect, register
from dlo.parallel import context as C
from dlo.parallel.context import merge_partial as _library_merge

CONTEXT_NB = "tp_tensor_parallel/context_parallel.ipynb"


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None):
    """``(out, lse)`` of a plain softmax attention; a query that sees no key gets ``out = 0``, ``lse = -inf``."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, -1)
    probs = torch.exp(scores - torch.where(torch.isinf(lse), torch.zeros_like(lse), lse).unsqueeze(-1))
    return probs @ v, lse


def _case(g: torch.Generator, shape: tuple[int, int, int, int], scale: float, masked: str = ""):
    """Two partial attentions of the same queries (float64) and the attention over all the keys. ``masked``:
    "a" (the last queries see none of a's keys) or "b" (the first queries see none of b's)."""
    b, h, s, d = shape
    la, lb = int(torch.randint(2, 7, (1,), generator=g)), int(torch.randint(2, 7, (1,), generator=g))
    q = torch.randn(b, h, s, d, generator=g, dtype=torch.float64) * scale
    k = torch.randn(b, h, la + lb, d, generator=g, dtype=torch.float64)
    v = torch.randn(b, h, la + lb, d, generator=g, dtype=torch.float64)
    mask_a, mask_b = torch.ones(s, la, dtype=torch.bool), torch.ones(s, lb, dtype=torch.bool)
    if masked == "a":
        mask_a[s // 2:] = False
    elif masked == "b":
        mask_b[: s // 2] = False
    a = attention(q, k[..., :la, :], v[..., :la, :], mask_a)
    bb = attention(q, k[..., la:, :], v[..., la:, :], mask_b)
    return a, bb, attention(q, k, v, torch.cat([mask_a, mask_b], 1))


def _reference(out_a, lse_a, out_b, lse_b):
    lse = torch.logaddexp(lse_a, lse_b)
    safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    return torch.exp(lse_a - safe).unsqueeze(-1) * out_a + torch.exp(lse_b - safe).unsqueeze(-1) * out_b, lse


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
                          "[..., seq, head_dim]: a weight per query must be broadcast over head_dim") from None
    expect(isinstance(result, tuple) and len(result) == 2 and all(isinstance(t, torch.Tensor) for t in result),
           f"{where}: return (out, lse), two tensors")
    return result


def _not_finite(where: str, args, dt: torch.dtype) -> CheckFailed:
    _, lse_a, _, lse_b = args
    finite = torch.cat([lse_a[torch.isfinite(lse_a)], lse_b[torch.isfinite(lse_b)]])
    top = float(finite.max()) if finite.numel() else 0.0
    low = math.log(torch.finfo(dt).tiny)
    high = math.log(torch.finfo(dt).max)
    if top < low:
        return CheckFailed(f"{where}: inf or NaN where every lse is about {top:.0f}: exp(lse) underflows to 0 in {dt} "
                           f"(below about {low:.0f}), and 0 / 0 or log(0) follows; the answer must not depend on where "
                           "the scores sit: work with differences of lse, never with a raw exp(lse)")
    if top > high:
        return CheckFailed(f"{where}: inf or NaN with scores around {top:.0f}: exp(lse) overflows {dt} (above about "
                           f"{high:.0f}): exponentiate differences of lse (subtract the max first), never a raw lse")
    if bool(torch.isinf(lse_a).any() | torch.isinf(lse_b).any()):
        side = "a" if bool(torch.isinf(lse_a).any()) else "b"
        return CheckFailed(f"{where}: NaN or inf where part {side} is empty (every key masked: lse_{side} = -inf, "
                           f"out_{side} = 0): an empty part must drop out and leave the other part as it is")
    return CheckFailed(f"{where}: the result holds inf or NaN")


def _diagnose_lse(where, args, out, lse, want_out, want_lse, tol) -> None:
    _, lse_a, _, lse_b = args
    if _close(lse, torch.maximum(lse_a, lse_b), tol):
        raise CheckFailed(f"{where}: the merged lse is the max of lse_a and lse_b; it must be the log-sum-exp of the "
                          "union: both parts add to the softmax's denominator")
    if _close(lse, want_lse - torch.maximum(lse_a, lse_b), tol):
        raise CheckFailed(f"{where}: the merged lse lacks the max you subtracted: add it back after the log")
    if _close(out, want_out, tol):
        raise CheckFailed(f"{where}: out is right but the returned lse is not the log-sum-exp of the union: the next "
                          "merge (the ring's next block) needs it")
    raise CheckFailed(f"{where}: the merged lse differs from the log-sum-exp of all the scores: max error "
                      f"{float((lse - want_lse).abs().max()):.3g}")


def _diagnose_out(where, args, out, want_out, want_lse, tol) -> None:
    out_a, lse_a, out_b, lse_b = args
    m = torch.maximum(lse_a, lse_b)
    ea, eb = torch.exp(lse_a - m).unsqueeze(-1), torch.exp(lse_b - m).unsqueeze(-1)
    wa, wb = torch.exp(lse_a - want_lse), torch.exp(lse_b - want_lse)
    candidates = [
        (ea * out_a + eb * out_b, "the weights are not renormalised: each part's weight is its share of the merged "
                                  "denominator, and the two weights sum to 1"),
        ((out_a + out_b) / 2, "you averaged the two outputs: weight each by its share of the softmax's denominator"),
        (torch.where((lse_a >= lse_b).unsqueeze(-1), out_a, out_b),
         "you kept the part with the larger lse only: both parts contribute, each by its share of the denominator"),
        (wb.unsqueeze(-1) * out_a + wa.unsqueeze(-1) * out_b,
         "the weights are swapped: each output must be weighted by its own part's share"),
    ]
    if out_a.shape[:-1] == (1,) * (out_a.dim() - 2) + out_a.shape[-1:]:  # [1, 1, s] * [1, 1, s, s] broadcasts
        candidates.append((wa * out_a + wb * out_b,
                           "the weights are multiplied along the wrong axis: lse is [..., seq], out is [..., seq, "
                           "head_dim]; a query's weight must be broadcast over head_dim (lse[..., None])"))
    for wrong, why in candidates:
        if _close(out, wrong, tol):
            raise CheckFailed(f"{where}: {why}")
    raise CheckFailed(f"{where}: out differs from the attention over all the keys (max error "
                      f"{float((out - want_out).abs().max()):.3g})")


def _check_empty_side(where: str, args, out, lse) -> None:
    """Where one side is empty (lse = -inf), the merge must return the other side exactly."""
    out_a, lse_a, out_b, lse_b = args
    for side, empty, other_out, other_lse in (("a", lse_a, out_b, lse_b), ("b", lse_b, out_a, lse_a)):
        rows = torch.isneginf(empty) & torch.isfinite(other_lse)
        if bool(rows.any()):
            exact = torch.equal(out[rows], other_out[rows]) and torch.equal(lse[rows], other_lse[rows])
            diff = float((out[rows].double() - other_out[rows].double()).abs().max())
            expect(exact, f"{where}: where part {side} is empty (lse_{side} = -inf) the merge must give the other "
                          f"part exactly, out and lse; it differs by {diff:.3g}")


def _diagnose(where: str, args, out, lse, want_out, want_lse, tol: float) -> None:
    dt = args[0].dtype
    expect(out.shape == want_out.shape and lse.shape == want_lse.shape,
           f"{where}: out must keep the shape {tuple(want_out.shape)} and lse {tuple(want_lse.shape)}, got "
           f"{tuple(out.shape)} and {tuple(lse.shape)}")
    expect(out.dtype == dt and lse.dtype == dt, f"{where}: keep the inputs' dtype {dt}, got {out.dtype} / {lse.dtype}")
    if not (torch.isfinite(out).all() and torch.isfinite(lse[torch.isfinite(want_lse)]).all()):
        raise _not_finite(where, args, dt)
    if not _close(lse, want_lse, tol):
        _diagnose_lse(where, args, out, lse, want_out, want_lse, tol)
    if not _close(out, want_out, tol):
        _diagnose_out(where, args, out, want_out, want_lse, tol)
    _check_empty_side(where, args, out, lse)


#: (where, shape [batch, heads, seq, head_dim], query scale, lse shift, dtype, tolerance, side fully masked)
MERGE_CASES = [
    ("float64, seq == head_dim, 1 head", (1, 1, 8, 8), 1.0, 0.0, torch.float64, 1e-12, ""),
    ("float32, 3 heads", (1, 3, 7, 16), 2.0, 0.0, torch.float32, 2e-6, ""),
    ("float32, scores of a few hundred", (1, 2, 6, 8), 120.0, 0.0, torch.float32, 2e-6, ""),
    ("float32, every score shifted by -120", (1, 2, 5, 8), 1.0, -120.0, torch.float32, 2e-6, ""),
    ("float64, every score shifted by -800", (1, 1, 5, 8), 1.0, -800.0, torch.float64, 1e-12, ""),
    ("float32, part b fully masked for the first queries", (1, 2, 6, 4), 1.0, 0.0, torch.float32, 2e-6, "b"),
    ("float64, part a fully masked for the last queries", (2, 1, 5, 4), 1.0, 0.0, torch.float64, 1e-12, "a"),
]


#: Tolerances by dtype (relative to 1 + |expected|): a bf16 result carries bf16's rounding (8 bits), not an error.
TOLERANCE = {torch.float64: 1e-12, torch.float32: 2e-6, torch.bfloat16: 3e-2}


def generated_merge_cases(seed: int, n: int):
    """``n`` seeded cases ``(where, shape, scale, shift, dtype, masked)`` over what the merge's correctness depends on:
    dtype (fp64, fp32, bf16), batch and heads (1 to 3), odd and even query counts (1 to 9), head_dim 1 to 16, query
    scale, a shift of every score, and a side fully masked for some queries (causal) or none. A small generator of
    our own rather than Hypothesis: the same cases on every run, in a fixed order, so a failure names a case."""
    g = torch.Generator().manual_seed(seed)
    pick = lambda options: options[int(torch.randint(len(options), (1,), generator=g))]  # noqa: E731
    cases = []
    for _ in range(n):
        dtype = pick((torch.float64, torch.float32, torch.bfloat16))
        shape = (pick((1, 2)), pick((1, 2, 3)), pick((1, 2, 5, 7, 8, 9)), pick((1, 3, 4, 8, 16)))
        masked = pick(("", "", "a", "b")) if shape[2] > 1 else ""
        scale, shift = pick((0.5, 1.0, 3.0)), pick((0.0, 0.0, 30.0, -50.0))
        where = (f"generated case: {str(dtype).split('.')[-1]}, [batch, heads, seq, head_dim] = {list(shape)}, "
                 f"scores x{scale} shifted by {shift:g}" + (f", part {masked} empty for some queries" if masked else ""))
        cases.append((where, shape, scale, shift, dtype, masked))
    return cases


def _merge_case(merge_partial: Callable, g: torch.Generator, case) -> None:
    where, shape, scale, shift, dtype, masked = case
    (oa, la), (ob, lb), _ = _case(g, shape, scale, masked)
    # shifting every score by a constant leaves out unchanged and shifts lse: a real attention still
    args = [t.to(dtype) for t in (oa, la + shift, ob, lb + shift)]
    want_out, want_lse = _reference(*(t.double() for t in args))  # the exact merge of the rounded inputs
    # float32 lse of a few hundred carry an error of ~1e-5 themselves: the tolerance follows their size
    big = float(torch.nan_to_num(want_lse.abs(), posinf=0).max())
    tol = TOLERANCE[dtype] * (1 + (big if big > 10 else 0))
    copies = [t.clone() for t in args]
    out, lse = _call(merge_partial, copies, where)
    expect(all(torch.equal(a, b) for a, b in zip(copies, args)),
           f"{where}: do not modify the inputs in place: return new tensors")
    _diagnose(where, args, out, lse, want_out, want_lse, tol)
    if not masked and dtype != torch.bfloat16:
        _merge_gradients(merge_partial, g, where, args, tol)


def _merge_gradients(merge_partial: Callable, g: torch.Generator, where: str, args, tol: float) -> None:
    """The gradients of a random weighting of (out, lse) with respect to the four inputs equal the reference's."""
    g_out = torch.randn(args[0].shape, generator=g, dtype=torch.float64)
    g_lse = torch.randn(args[1].shape, generator=g, dtype=torch.float64)

    def grads(fn, inputs):
        inputs = [t.detach().clone().requires_grad_(True) for t in inputs]
        out, lse = fn(*inputs)
        if not (out.requires_grad or lse.requires_grad):
            return [None] * 4
        loss = (out.double() * g_out).sum() + (lse.double() * g_lse).sum()
        return list(torch.autograd.grad(loss, inputs, allow_unused=True))

    got, want = grads(merge_partial, args), grads(_reference, [t.double() for t in args])
    for name, a, b in zip(("out_a", "lse_a", "out_b", "lse_b"), got, want):
        if a is None:
            raise CheckFailed(f"{where}: out and lse are right, but no gradient reaches {name}: part of the "
                              "computation is cut from autograd (a torch.no_grad block, a .detach(), a number taken "
                              "out with .item()...); the ring's backward needs the merge to stay differentiable")
        if not bool(torch.isfinite(a).all()):
            raise CheckFailed(f"{where}: out and lse are right and finite, but their gradient with respect to {name} "
                              "holds NaN or inf: a term that overflows still gets a gradient even where its value is "
                              "discarded (0 * inf = NaN, e.g. in the branch torch.where does not take): exponentiate "
                              "only differences that are <= 0")
        diff = float((a.double() - b).abs().max())
        if not diff <= 10 * tol * (1 + float(b.abs().max())):
            raise CheckFailed(f"{where}: out and lse are right, but their gradient with respect to {name} differs from "
                              f"the reference's by up to {diff:.3g}: part of the computation does not reach autograd "
                              "as it is (e.g. weights computed under torch.no_grad or detached)")


@register("context", "merge", ("merge_partial",), CONTEXT_NB)
def _check_merge(merge_partial: Callable) -> str:
    g = torch.Generator().manual_seed(0)
    for where, shape, scale, shift, dtype, _, masked in MERGE_CASES:
        _merge_case(merge_partial, g, (where, shape, scale, shift, dtype, masked))
    for case in generated_merge_cases(seed=2024, n=24):
        _merge_case(merge_partial, g, case)
    # associativity: (a ∪ b) ∪ c, with the lse the student returned, equals the attention over all three
    q = torch.randn(2, 2, 5, 8, generator=g, dtype=torch.float64)
    k = torch.randn(2, 2, 12, 8, generator=g, dtype=torch.float64)
    v = torch.randn(2, 2, 12, 8, generator=g, dtype=torch.float64)
    parts = [attention(q, k[..., s, :], v[..., s, :]) for s in (slice(0, 3), slice(3, 7), slice(7, 12))]
    acc = parts[0]
    for part in parts[1:]:
        acc = _call(merge_partial, [*acc, *part], "three blocks one after another")
    want_out, want_lse = attention(q, k, v)
    expect(_close(acc[0], want_out, 1e-12) and _close(acc[1], want_lse, 1e-12),
           "three blocks merged one after another differ from the attention over all the keys: the lse you return "
           "must be that of the union, since the next merge uses it")
    return ("the attention over the union of two key sets: exact in float32 and float64, either side empty, no "
            "overflow at large scores nor underflow far below zero, blocks merged in a chain")


# ----------------------------------------------------------------------------------------------------
# One ring step: which blocks are skipped, which are masked, and the merge
# ----------------------------------------------------------------------------------------------------
class _CountingMerge:
    """The library's merge, counting its calls (a fully masked block must never reach it)."""

    def __init__(self) -> None:
        self.merge, self.calls = _library_merge, 0

    def __call__(self, *args):
        self.calls += 1
        return self.merge(*args)


def _block(q, k, v, mask: str):
    """``(out, lse)`` of one query chunk against one key chunk: "none", "causal" (query i sees keys 0..i), "upper"."""
    c = q.shape[-2]
    m = None if mask == "none" else torch.ones(c, c, dtype=torch.bool).tril()
    if mask == "upper":
        m = torch.ones(c, c, dtype=torch.bool).triu()
    return attention(q, k, v, m)


def _step(ring_step: Callable, parts, q, q_chunks, k, v, k_chunks, merge, where: str):
    try:
        new = ring_step(list(parts), q, list(q_chunks), k, v, list(k_chunks), merge)
    except NotImplementedError:
        raise
    except (RuntimeError, IndexError, TypeError, ValueError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CheckFailed(f"{where}: it raised {type(exc).__name__}: {first[:160]}") from None
    expect(isinstance(new, (list, tuple)) and len(new) == len(q_chunks),
           f"{where}: return the list of running (out, lse), one per query chunk ({len(q_chunks)}), got "
           f"{type(new).__name__}")
    return list(new)


def _same(part, want, tol: float = 1e-12) -> bool:
    return part is not None and want is not None and all(_close(a, b, tol) for a, b in zip(part, want))


def _check_kinds(ring_step: Callable, g: torch.Generator) -> None:
    """One query chunk against one key chunk, each kind of block alone: the message names the kind."""
    c, d = 3, 4
    q, k, v = (torch.randn(1, 2, c, d, generator=g, dtype=torch.float64) for _ in range(3))
    full, causal, upper = (_block(q, k, v, m) for m in ("none", "causal", "upper"))
    chunks = "compare the chunk numbers (q_chunks, k_chunks), not the blocks' places in the lists"
    # an earlier key chunk: every key visible
    merge = _CountingMerge()
    got = _step(ring_step, [None], q, [2], k, v, [1], merge, "query chunk 2, key chunk 1 (earlier keys)")[0]
    expect(got is not None, "query chunk 2 against key chunk 1: the block of earlier keys was skipped; every key "
                            "of an earlier chunk is visible to every query of a later one")
    if not _same(got, full):
        expect(not _same(got, causal), "query chunk 2 against key chunk 1: the block of earlier keys is masked; only "
                                       f"the diagonal block (the same chunk) is: {chunks}")
        raise CheckFailed("query chunk 2 against key chunk 1 (every key visible): the result differs from the "
                          f"attention over the block by {float((got[0] - full[0]).abs().max()):.3g}")
    # the same chunk: the causal mask inside
    got = _step(ring_step, [None], q, [1], k, v, [1], _CountingMerge(), "query chunk 1, key chunk 1 (diagonal)")[0]
    expect(got is not None, "query chunk 1 against key chunk 1: the diagonal block was skipped; each query sees the "
                            "keys of its own chunk up to itself")
    if not _same(got, causal):
        expect(not _same(got, full), "query chunk 1 against key chunk 1: the diagonal block is not masked: a query "
                                     "may only see the keys of its chunk up to its own position")
        expect(not _same(got, upper), "query chunk 1 against key chunk 1: the diagonal block keeps the wrong "
                                      "triangle: query i sees keys 0..i of the chunk, not i..end")
        raise CheckFailed("query chunk 1 against key chunk 1 (diagonal): the result differs from the causal attention "
                          f"inside the block by {float((got[0] - causal[0]).abs().max()):.3g}")
    # a later chunk: fully masked, skipped -- no work, no merge, the running result untouched
    merge = _CountingMerge()
    got = _step(ring_step, [causal], q, [1], k, v, [2], merge, "query chunk 1, key chunk 2 (later keys)")[0]
    expect(merge.calls == 0 and _same(got, causal, 0.0),
           "query chunk 1 against key chunk 2: a fully masked block (every key later than every query) was used; "
           f"it must be skipped: no attention, no merge, the running result left as it is ({chunks})")
    # an earlier chunk again, onto a running result: merged, not replaced
    merge = _CountingMerge()
    got = _step(ring_step, [causal], q, [2], k, v, [1], merge, "a running result, then key chunk 1")[0]
    want = merge.merge(*causal, *full)
    expect(not _same(got, full), "a new block replaced the running result instead of being merged into it")
    expect(_same(got, want), "a running result and a new visible block: the result differs from their merge by "
                             f"{float((got[0] - want[0]).abs().max()):.3g}")


#: (where, ranks, chunk length, layout, heads, head_dim, dtype): fixed cases, then :func:`generated_ring_cases`
RING_CASES = [
    ("2 ranks, balanced, chunks of 3", 2, 3, "balanced", 2, 4, torch.float64),
    ("3 ranks, balanced, chunks of 5", 3, 5, "balanced", 2, 4, torch.float64),
    ("3 ranks, contiguous, chunks of 3", 3, 3, "contiguous", 2, 4, torch.float64),
]
RING_TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5, torch.bfloat16: 6e-2}


def generated_ring_cases(seed: int, n: int):
    """``n`` seeded ring cases over cp = 2, 3, 4, both layouts, odd and even chunk lengths (1 to 5), 1 to 3 heads,
    head_dim 1 to 8, fp64 / fp32 / bf16 (a fixed generator of our own, as for the merge: same cases every run)."""
    g = torch.Generator().manual_seed(seed)
    pick = lambda options: options[int(torch.randint(len(options), (1,), generator=g))]  # noqa: E731
    cases = []
    for _ in range(n):
        cp, c, layout = pick((2, 3, 4)), pick((1, 2, 3, 5)), pick(("balanced", "contiguous"))
        heads, d, dtype = pick((1, 3)), pick((1, 4, 8)), pick((torch.float64, torch.float32, torch.bfloat16))
        cases.append((f"generated case: {cp} ranks, {layout}, chunks of {c}, {heads} head(s), head_dim {d}, "
                      f"{str(dtype).split('.')[-1]}", cp, c, layout, heads, d, dtype))
    return cases


def _ring_case(ring_step: Callable, g: torch.Generator, case) -> None:
    where, cp, c, layout, heads, d, dtype = case
    seq = C.num_chunks(cp, layout) * c
    q, k, v = (torch.randn(1, heads, seq, d, generator=g, dtype=torch.float64).to(dtype).requires_grad_(True)
               for _ in range(3))
    causal = torch.ones(seq, seq, dtype=torch.bool).tril()
    outs = []
    for rank in range(cp):
        q_chunks = C.rank_chunks(rank, cp, layout)
        parts, merge, blocks = [None] * len(q_chunks), _CountingMerge(), 0
        for step in range(cp):  # the K/V block of rank - step arrives at step `step`
            src = (rank - step) % cp
            k_chunks = C.rank_chunks(src, cp, layout)
            blocks += sum(kc <= qc for qc in q_chunks for kc in k_chunks)
            parts = _step(ring_step, parts, C.shard(q, cp, rank, layout), q_chunks, C.shard(k, cp, src, layout),
                          C.shard(v, cp, src, layout), k_chunks, merge, f"{where}, rank {rank}, step {step}")
        expect(all(p is not None for p in parts), f"{where}, rank {rank}: a query chunk saw no key after the "
                                                  "whole ring")
        expect(merge.calls == blocks - len(q_chunks),
               f"{where}, rank {rank}: {merge.calls} merges for {blocks} visible blocks over {len(q_chunks)} "
               "query chunks: each visible block is merged once into its chunk's running result, the first one "
               "taken as it is, and a fully masked block never")
        outs.append(torch.cat([p[0] for p in parts], -2))
    order = torch.argsort(torch.cat([C.shard_positions(seq, cp, r, layout) for r in range(cp)]))
    got = torch.cat(outs, -2)[..., order, :]
    expect(got.dtype == dtype, f"{where}: keep the inputs' dtype {dtype}, got {got.dtype}")
    ref_in = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    want = attention(*ref_in, causal)[0]
    tol = RING_TOLERANCE[dtype]
    expect(_close(got, want, tol), f"{where}: the ring's result differs from causal attention over the whole "
                                   f"sequence by {float((got.detach().double() - want.detach()).abs().max()):.3g}")
    if dtype == torch.bfloat16:
        return
    g_out = torch.randn(want.shape, generator=g, dtype=torch.float64)
    wanted = torch.autograd.grad((want * g_out).sum(), ref_in)
    if not got.requires_grad:
        raise CheckFailed(f"{where}: the ring's result is right, but no gradient reaches q, k or v: part of the step "
                          "is cut from autograd (a torch.no_grad block, a .detach()...); ring attention is trained "
                          "through")
    grads = torch.autograd.grad((got.double() * g_out).sum(), (q, k, v), allow_unused=True)
    for name, a, b in zip("qkv", grads, wanted):
        diff = float("inf") if a is None else float((a.double() - b).abs().max())
        expect(diff <= 100 * tol * (1 + float(b.abs().max())),
               f"{where}: the ring's result is right, but its gradient with respect to {name} differs from causal "
               f"attention's by up to {diff:.3g}: part of the step does not reach autograd as it is")


@register("context", "ring_step", ("ring_step",), CONTEXT_NB)
def _check_ring_step(ring_step: Callable) -> str:
    g = torch.Generator().manual_seed(1)
    _check_kinds(ring_step, g)
    for case in RING_CASES + generated_ring_cases(seed=7, n=12):
        _ring_case(ring_step, g, case)
    return ("earlier blocks whole, the diagonal block masked, later blocks skipped with no merge, each visible block "
            "merged once: the simulated ring equals causal attention, values and gradients (2 to 4 ranks, both "
            "layouts, odd chunks, fp64 / fp32 / bf16)")
