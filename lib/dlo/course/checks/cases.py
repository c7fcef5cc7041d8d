"""Generated cases for checkers: the student's function and the reference run on the same seeded inputs.

A checker built on this module draws its cases with :func:`seeded` (fixed edge cases plus ``n`` drawn ones, ordered
smallest first, the same on every run), runs both functions on each case with :func:`first_failure` (values, and
with ``grads=True`` the gradients of every floating-point input that autograd reaches), and turns the first
difference into one line that names the case: ``with fp32, batch 3, length 5: out differs by 0.12 at [1, 0]
(got 0.5, expected 0.38)``. A checker that knows a mistake from its signature names it before falling back on
this line; the fallback never guesses at a cause. :func:`judge` does both: at the first case where the answer
differs, it names a known wrong formula only if that formula gives the answer's output on EVERY case tried (not
only the failing one); otherwise the message is the case and the difference alone, right for any answer.

Why a small seeded generator and not Hypothesis: a check runs inside a student's notebook, where Hypothesis'
database, health checks and shrinking time are out of place, and it must give the same smallest failing case on
every run. The cases are ordered by a size the checker gives, so the first failure reported is the smallest one
tried, which is what shrinking would find for the sizes the checker draws.
"""
from __future__ import annotations

import copy
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import torch

from dlo.course.checks.framework import CheckFailed


@dataclass(frozen=True)
class Case:
    """One input of an exercise: what a failure message shows (``label``), an order (``size``: smaller first) and
    the keyword arguments both functions are called with."""

    label: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    size: float = 0.0


def seeded(draw: Callable[[random.Random], Case], n: int, *, seed: int = 0,
           fixed: Iterable[Case] = ()) -> list[Case]:
    """``fixed`` (the edge cases that matter) and ``n`` cases drawn by ``draw`` from seeded generators, ordered by
    size (stable: among equal sizes, fixed cases first). The same list on every call."""
    drawn = [draw(random.Random(seed * 7919 + i)) for i in range(n)]
    return sorted([*fixed, *drawn], key=lambda c: c.size)


#: (rtol, atol) by dtype: what float rounding allows when the same sums are taken in another order. bfloat16 keeps
#: 8 bits of mantissa (a relative step of 2**-8 = 0.004), float16 11, float32 24, float64 53.
TOLERANCE = {torch.float64: (1e-9, 1e-9), torch.float32: (1e-5, 1e-5), torch.bfloat16: (3e-2, 3e-2),
             torch.float16: (4e-3, 4e-3)}


def tolerance(dtype: torch.dtype | None, scale: float = 1.0) -> tuple[float, float]:
    """(rtol, atol) for ``dtype`` (float32's for a non-float or unknown dtype), multiplied by ``scale`` (a
    computation that accumulates over many terms earns a larger one)."""
    rtol, atol = TOLERANCE.get(dtype, TOLERANCE[torch.float32])
    return rtol * scale, atol * scale


def _fmt(x: float) -> str:
    return f"{x:.4g}"


def compare(got: Any, want: Any, what: str, *, dtype: torch.dtype | None = None, scale: float = 1.0,
            of_largest: float | None = None) -> str | None:
    """None when ``got`` matches ``want``; else one line saying where they differ. Tensors are compared by shape,
    dtype and values (within :func:`tolerance` of the expected dtype or ``dtype``); numbers within the same
    tolerance; tuples, lists and dicts element by element (the first difference is named by its index or key);
    anything else by equality. ``of_largest``: a floating-point tensor's values are instead allowed that fraction of
    the expected tensor's largest magnitude (weights after a step: a sum taken in another order moves every element
    by about the same amount, so the small ones by a large relative error)."""
    if isinstance(want, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return f"{what} is {type(got).__name__}, expected a tensor"
        if tuple(got.shape) != tuple(want.shape):
            return f"{what} has shape {tuple(got.shape)}, expected {tuple(want.shape)}"
        if got.dtype != want.dtype:
            return f"{what} is {got.dtype}, expected {want.dtype}"
        if not want.is_floating_point():
            wrong = (got != want).nonzero()
            if len(wrong):
                at = tuple(int(i) for i in wrong[0])
                return f"{what} differs at {list(at)} (got {got[at].item()}, expected {want[at].item()})"
            return None
        rtol, atol = tolerance(dtype or want.dtype, scale)
        g, w = got.detach().double().cpu(), want.detach().double().cpu()
        if of_largest is not None:
            largest = float(w.abs().nan_to_num(0.0, 0.0, 0.0).max()) if w.numel() else 0.0
            rtol, atol = 0.0, of_largest * max(largest, 1e-6)
        finite_w = torch.isfinite(w)
        if not bool((torch.isfinite(g) == finite_w).all()):
            at = tuple(int(i) for i in (torch.isfinite(g) != finite_w).nonzero()[0])
            return f"{what} is {g[at].item()} at {list(at)}, expected {w[at].item()}"
        err = torch.where(finite_w, (g - w).abs(), torch.where(g == w, 0.0, float("inf")))
        bad = err > atol + rtol * w.abs().nan_to_num(0.0)
        if bool(bad.any()):
            flat = int(torch.where(bad, err, torch.full_like(err, -1.0)).flatten().argmax())
            at = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), err.shape)) if err.dim() else ()
            where = f" at {list(at)}" if at else ""
            return (f"{what} differs by {_fmt(float(err[at]))}{where} (got {_fmt(float(g[at]))}, expected "
                    f"{_fmt(float(w[at]))})")
        return None
    if isinstance(want, bool) or want is None or isinstance(want, str):
        return None if got == want else f"{what} is {got!r}, expected {want!r}"
    if isinstance(want, (int, float)):
        if not isinstance(got, (int, float)) or isinstance(got, bool):
            return f"{what} is {got!r}, expected a number close to {_fmt(want)}"
        rtol, atol = tolerance(dtype, scale)
        return None if abs(got - want) <= atol + rtol * abs(want) else f"{what} is {_fmt(got)}, expected {_fmt(want)}"
    if isinstance(want, (tuple, list)):
        if not isinstance(got, (tuple, list)) or len(got) != len(want):
            n = len(got) if isinstance(got, (tuple, list)) else type(got).__name__
            return f"{what} has {n} items, expected {len(want)}"
        for i, (a, b) in enumerate(zip(got, want)):
            problem = compare(a, b, f"{what}[{i}]", dtype=dtype, scale=scale, of_largest=of_largest)
            if problem:
                return problem
        return None
    if isinstance(want, dict):
        if not isinstance(got, dict) or set(got) != set(want):
            keys = sorted(got) if isinstance(got, dict) else type(got).__name__
            return f"{what} has keys {keys}, expected {sorted(want)}"
        for key in want:
            problem = compare(got[key], want[key], f"{what}[{key!r}]", dtype=dtype, scale=scale, of_largest=of_largest)
            if problem:
                return problem
        return None
    return None if got == want else f"{what} is {got!r}, expected {want!r}"


def _leaves(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for item in x for t in _leaves(item)]
    if isinstance(x, dict):
        return [t for item in x.values() for t in _leaves(item)]
    return []


def with_grads(fn: Callable[..., Any], kwargs: dict[str, Any], *, seed: int = 0,
               params: Sequence[torch.nn.Parameter] = ()) -> tuple[Any, dict[str, torch.Tensor | None]]:
    """Call ``fn(**kwargs)`` on copies of the inputs, the floating-point tensors among them requiring gradients, and
    back-propagate a seeded random cotangent through every floating-point tensor it returns. Returns the output
    and the gradient of each tensor input (by name, None where autograd did not reach it) and of each of
    ``params`` (``"param i"``)."""
    inputs = {k: (v.detach().clone().requires_grad_(v.is_floating_point()) if isinstance(v, torch.Tensor) else v)
              for k, v in kwargs.items()}
    for p in params:
        p.grad = None
    out = fn(**inputs)
    outs = [t for t in _leaves(out) if t.is_floating_point() and t.requires_grad]
    if outs:
        g = torch.Generator().manual_seed(seed)
        cotangents = [torch.randn(t.shape, generator=g, dtype=torch.float64).to(t.dtype) for t in outs]
        torch.autograd.backward(outs, cotangents)
    grads: dict[str, torch.Tensor | None] = {k: v.grad for k, v in inputs.items()
                                             if isinstance(v, torch.Tensor) and v.is_floating_point()}
    grads.update({f"param {i}": p.grad for i, p in enumerate(params)})
    return out, grads


def run_student(fn: Callable[..., Any], case: Case, call: Callable[[Callable, dict], Any] | None = None) -> Any:
    """The student's function on ``case``: NotImplementedError goes through (the stub), any other exception
    becomes a CheckFailed naming the case and the exception's first line."""
    kwargs = copy.deepcopy(case.kwargs)
    try:
        return call(fn, kwargs) if call else fn(**kwargs)
    except (NotImplementedError, CheckFailed):
        raise
    except Exception as exc:  # noqa: BLE001 - any error of the answer is reported, in one line
        first = (str(exc).splitlines() or [""])[0][:200]
        raise CheckFailed(f"with {case.label}: it raised {type(exc).__name__}: {first}") from None


def first_failure(cases: Sequence[Case], student: Callable[..., Any], reference: Callable[..., Any], *,
                  what: str = "the result", grads: bool = False, dtype_of: Callable[[Case], Any] | None = None,
                  scale: float = 1.0) -> tuple[Case, str] | None:
    """The first case (smallest first) where ``student`` and ``reference`` differ, with a one-line description of
    the difference, or None. With ``grads``, the gradients of the floating-point tensor inputs are compared too
    (:func:`with_grads`, the same cotangent for both). ``dtype_of(case)`` picks the tolerance's dtype (default: the
    expected tensors' own)."""
    for case in cases:
        dtype = dtype_of(case) if dtype_of else None
        if grads:
            want, want_g = with_grads(reference, copy.deepcopy(case.kwargs))
            got, got_g = run_student(lambda **kw: with_grads(student, kw), case)
        else:
            want, want_g = reference(**copy.deepcopy(case.kwargs)), {}
            got, got_g = run_student(student, case), {}
        problem = compare(got, want, what, dtype=dtype, scale=scale)
        for name in want_g if not problem else ():
            if (want_g[name] is None) != (got_g.get(name) is None):
                problem = (f"the gradient of {name} is {'missing' if got_g.get(name) is None else 'there'}, "
                           f"expected {'none' if want_g[name] is None else 'one'}: "
                           + ("a step is detached from autograd (no_grad, .detach(), .item(), .data)"
                              if got_g.get(name) is None else "the result depends on it where it should not"))
            elif want_g[name] is not None:
                problem = compare(got_g[name], want_g[name], f"the gradient of {name}", dtype=dtype, scale=scale)
            if problem:
                break
        if problem:
            return case, problem
    return None


def expect_same(cases: Sequence[Case], student: Callable[..., Any], reference: Callable[..., Any], **kw) -> int:
    """Raise :class:`CheckFailed` ``with <case>: <difference>`` at the first (smallest) failing case; return how
    many cases were tried."""
    failure = first_failure(cases, student, reference, **kw)
    if failure:
        case, problem = failure
        raise CheckFailed(f"with {case.label}: {problem}")
    return len(cases)


#: A known mistake: a function with the exercise's signature that computes the wrong formula, and what to say.
Mistake = tuple[Callable[..., Any], str]
#: (got, want, case) -> one line, or None when they match.
Judge = Callable[[Any, Any, Case], "str | None"]


def _default(got: Any, want: Any, case: Case) -> str | None:
    return compare(got, want, "the result")


def _gives(variant: Callable[..., Any], case: Case, got: Any, same: Judge) -> bool:
    try:
        return same(got, variant(**copy.deepcopy(case.kwargs)), case) is None
    except Exception:  # noqa: BLE001 - a formula that cannot run on this case is not the answer's signature
        return False


def matching_mistake(cases: Sequence[Case], outputs: Sequence[Any], mistakes: Sequence[Mistake],
                     same: Judge = _default) -> str | None:
    """The message of the first mistake whose formula gives ``outputs`` on every case, or None."""
    for variant, message in mistakes:
        if all(_gives(variant, case, got, same) for case, got in zip(cases, outputs)):
            return message
    return None


def judge(cases: Sequence[Case], student: Callable[..., Any], reference: Callable[..., Any],
          mistakes: Sequence[Mistake] = (), *, same: Judge = _default) -> int:
    """Raise :class:`CheckFailed` ``with <case>: <difference>[: <known mistake>]`` at the first case where the
    student's output differs from the reference's (``same`` says how they differ); return how many cases were tried.
    A known mistake is named only if its formula gives the student's output on every case."""
    for case in cases:
        got = run_student(student, case)
        problem = same(got, reference(**copy.deepcopy(case.kwargs)), case)
        if problem is None:
            continue
        try:
            outputs = [run_student(student, c) for c in cases]
        except CheckFailed:
            outputs = None  # it raises on some other case: no formula of ours is its signature
        named = matching_mistake(cases, outputs, mistakes, same) if outputs is not None else None
        raise CheckFailed(f"with {case.label}: {problem}" + (f": {named}" if named else ""))
    return len(cases)
