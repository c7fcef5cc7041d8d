"""No student copy, hint below level 3 or failure message hands out the reference solution's code.

For every exercise step (``dlo check --list``), the *solution lines* are the non-trivial code lines of its
reference solution, as ``dlo solution`` prints them (:func:`dlo.course.student.step_solution`): lines with an
assignment or a call, at least :data:`MIN_CHARS` characters once whitespace is removed, comments and bare
``return name`` lines left out. None of them may appear, whitespace aside,

1. in the step's student copy (its code cells and markdown, or the student script),
2. in the step's goal and hint levels 1 and 2 (the idea, the shape of the computation; level 3 points to the API
   and may name the functions, but still not write the lines),
3. in the failure messages the checker gives the step's wrong answers (tests/wrong_answers), for the steps of
   :data:`MESSAGE_STEPS` (each needs its corpus run again: the single-process ones, kept cheap).

Steps that still dictate are listed in :data:`STILL_DICTATING`, marked ``xfail``: fix a step, then remove it from
the list (its test then passes instead of xfailing).
"""
from __future__ import annotations

import ast
import json
import re
from functools import lru_cache
from pathlib import Path

import pytest

from dlo.course import catalog
from dlo.course.hints import hint_for
from dlo.course.student import step_solution, student_path
from dlo.runtime.paths import ROOT

MIN_CHARS = 20

#: Steps whose student copy, hints or messages still contain a solution line (measured when this test was written):
#: remove a step once it is fixed.
STILL_DICTATING: set[str] = set()

#: Steps whose wrong-answer messages are checked here too (their corpus is run again: single-process checkers only).
MESSAGE_STEPS: set[str] = {"experts/balance", "experts/routing", "context/merge", "context/ring_step",
                            "apis/fabric_port", "grid/coords", "pipeline/1f1b", "pipeline/interleaved"}

CORPUS = Path(__file__).with_name("wrong_answers")
STEPS = [f"{course}/{step}" for course, steps in catalog.steps().items() for step in steps]
_SPACE = re.compile(r"\s+")


def _normal(text: str) -> str:
    return _SPACE.sub("", text)


def _is_code_line(line: str) -> bool:
    """A line that does something: an assignment or a call (what would be copied), not a bare return of a name."""
    text = line.strip()
    if not text or text.startswith("#") or len(_normal(text)) < MIN_CHARS:
        return False
    if text.startswith("return") and not re.search(r"\w\(", text):  # `return a, b`; `return f(x)` counts
        return False
    try:
        node = ast.parse(text if not text.endswith(":") else text + " pass")
    except SyntaxError:  # a continuation line of a longer statement: judge it by its look
        return bool(re.search(r"\w\(|[^=!<>]=[^=]", text))
    return any(isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Call)) for n in ast.walk(node))


@lru_cache(maxsize=None)
def solution_lines(step: str) -> tuple[str, ...]:
    course, name = step.split("/")
    lines = []
    for _, _, code in step_solution(course, name):
        for line in code.splitlines():
            code_line = line.split("  #")[0]  # a trailing comment is not part of the code
            if _is_code_line(code_line):
                lines.append(_normal(code_line))
    return tuple(dict.fromkeys(lines))


def _student_text(step: str) -> str:
    course, name = step.split("/")
    path = student_path(ROOT / catalog.find(course, name).notebook)
    if path.suffix != ".ipynb":
        return path.read_text()
    cells = json.loads(path.read_text())["cells"]
    return "\n".join("".join(c["source"]) if isinstance(c["source"], list) else c["source"] for c in cells)


def _hint_text(step: str) -> str:
    h = hint_for(*step.split("/"))
    return "\n".join([h.goal, h.concept, h.shape or ""])


def _messages(step: str) -> list[tuple[str, str]]:
    from dlo.course import checks

    course, name = step.split("/")
    out = []
    for path in sorted((CORPUS / course / name).glob("*.py")):
        if path.name.startswith("ok_"):
            continue
        try:
            checks.check(course, name, checks.load_exercises(path))
        except checks.CheckFailed as error:
            out.append((path.name, str(error)))
    return out


def found_in(step: str, text: str) -> list[str]:
    flat = _normal(text)
    return [line for line in solution_lines(step) if line in flat]


def _marks(step: str) -> list:
    return [pytest.mark.xfail(reason="still dictates a solution line (see STILL_DICTATING)")] \
        if step in STILL_DICTATING else []


def test_the_lists_name_real_steps():
    assert not (STILL_DICTATING - set(STEPS)), f"no such steps: {sorted(STILL_DICTATING - set(STEPS))}"
    assert not (MESSAGE_STEPS - set(STEPS)), f"no such steps: {sorted(MESSAGE_STEPS - set(STEPS))}"


def test_a_solution_line_is_found_where_it_is_copied():
    """The detector itself: a solution line pasted into a text is found there, reformatted or not."""
    step = "context/merge"
    line = solution_lines(step)[0]
    assert found_in(step, f"some prose\n    {line}  \n") == [line]
    assert not found_in(step, "lse is the log-sum-exp of the two parts")
    assert _is_code_line("out = torch.exp(lse_a - lse).unsqueeze(-1) * out_a")
    assert not _is_code_line("return out, lse")
    assert not _is_code_line("# counts = torch.bincount(index, minlength=e)")


@pytest.mark.parametrize("step", [pytest.param(s, marks=_marks(s)) for s in STEPS])
def test_no_solution_line_in_the_student_copy_or_the_hints(step):
    # a step whose solution has no line long enough to count passes trivially: nothing in it could be copied
    leaks = [f"student copy: {line}" for line in found_in(step, _student_text(step))]
    leaks += [f"goal or hint level 1-2: {line}" for line in found_in(step, _hint_text(step))]
    assert not leaks, f"{step} dictates its solution:\n" + "\n".join(leaks)


@pytest.mark.parametrize("step", sorted(MESSAGE_STEPS))
def test_no_solution_line_in_the_failure_messages(step):
    leaks = [f"{name}: {line}" for name, message in _messages(step) for line in found_in(step, message)]
    assert not leaks, f"{step}: failure messages contain solution lines:\n" + "\n".join(leaks)
