"""Naming a known mistake only when its signature is certain, over the generated cases of :mod:`.cases`.

:func:`judge` runs the student's function and the reference on every case (smallest first). At the first case where
they differ, it looks for a known wrong formula that gives the student's output on EVERY case tried (not only the
failing one): then, and only then, the message names that mistake after the case and the difference. Otherwise the
message is the case and the difference alone, which is right for any answer that reaches it.
"""
from __future__ import annotations

import copy
from typing import Any, Callable, Sequence

from dlo.course.checks.cases import Case, compare, run_student
from dlo.course.checks.framework import CheckFailed

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
