"""Every checker rejects the plausible wrong answers of tests/wrong_answers/, and says what is wrong.

The corpus: ``tests/wrong_answers/<course>/<step>/<misconception>.py``. Each file is written the way a
student would write the exercise (the functions the step checks, with their real names), gets the
mistake its name describes, and sets ``EXPECT``: words the checker's message must contain (case
insensitive) so that the message names the mistake, not only "something differs". Files are loaded like
a course script (``load_exercises``), so the multi-process checkers can start processes that import them.

Correct alternatives live beside them, named ``ok_<what>.py`` (no ``EXPECT``): a right answer written another
way than the reference solution, which the checker must accept (:func:`test_correct_alternative_passes`).

Every run prints the corpus size and the rejection rate at the end (tests/conftest.py adds it to the summary; it
counts the answers of every xdist worker, since ``make test`` spreads this file's tests over both cores).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from dlo.course import checks
from test_hints_do_not_dictate import STILL_DICTATING, found_in

CORPUS = Path(__file__).with_name("wrong_answers")
FILES = sorted(p for p in CORPUS.glob("*/*/*.py") if not p.name.startswith("ok_"))
CORRECT = sorted(CORPUS.glob("*/*/ok_*.py"))


def _id(path: Path) -> str:
    return "/".join(path.relative_to(CORPUS).with_suffix("").parts)


def test_corpus_is_not_empty_and_names_real_steps():
    assert len(FILES) >= 100
    for path in FILES:
        course, step = path.parent.parent.name, path.parent.name
        assert course in checks.REGISTRY and step in checks.REGISTRY[course], f"{_id(path)}: no such step"


#: Every step's checker is tried against at least five plausible wrong answers, across the families of mistake that
#: fool a checker (a flag set but the behaviour wrong, part of the result right, inputs that never reach the mistake),
#: and against at least one correct answer written another way than the reference solution (``ok_*.py``).
MIN_WRONG, MIN_CORRECT = 5, 1


def _steps() -> list[str]:
    return [f"{course}/{step}" for course, steps in checks.REGISTRY.items() for step in steps]


def test_every_step_has_enough_wrong_answers():
    counts: dict[str, int] = {}
    for path in FILES:
        step = _id(path).rsplit("/", 1)[0]
        counts[step] = counts.get(step, 0) + 1
    short = [f"{name} ({counts.get(name, 0)} of {MIN_WRONG})" for name in _steps() if counts.get(name, 0) < MIN_WRONG]
    assert not short, "steps with too few wrong answers in tests/wrong_answers: " + ", ".join(short)


def test_every_step_has_a_correct_alternative():
    counts: dict[str, int] = {}
    for path in CORRECT:
        step = _id(path).rsplit("/", 1)[0]
        counts[step] = counts.get(step, 0) + 1
    short = [name for name in _steps() if counts.get(name, 0) < MIN_CORRECT]
    assert not short, "steps with no correct alternative (ok_*.py) in tests/wrong_answers: " + ", ".join(short)


@pytest.mark.parametrize("path", FILES, ids=[_id(p) for p in FILES])
def test_wrong_answer_is_rejected_with_a_reason(path: Path, record_property):
    course, step = path.parent.parent.name, path.parent.name
    ns = checks.load_exercises(path)
    expected = ns.get("EXPECT")
    assert expected, f"{_id(path)} must set EXPECT (words the rejection message must contain)"
    words = [expected] if isinstance(expected, str) else list(expected)
    # read by tests/conftest.py's summary: whether the checker rejected it (the message is judged below)
    record_property("wrong_answer", _id(path))
    rejected = False
    try:
        checks.check(course, step, ns)
    except checks.CheckFailed as error:
        rejected, message = True, str(error)
    record_property("wrong_answer_rejected", rejected)
    assert rejected, f"{_id(path)}: the checker accepted this wrong answer"
    assert "not implemented yet" not in message, f"{_id(path)}: the wrong answer must be a complete answer"
    for word in words:
        assert word.lower() in message.lower(), f"{_id(path)}: the message does not say {word!r}: {message}"
    step_name = f"{course}/{step}"
    if step_name not in STILL_DICTATING:  # a failure message names the mistake; it never hands out the solution
        copied = found_in(step_name, message)
        assert not copied, f"{_id(path)}: the message contains the solution's line(s) {copied}: {message}"


@pytest.mark.parametrize("path", CORRECT, ids=[_id(p) for p in CORRECT])
def test_correct_alternative_passes(path: Path):
    course, step = path.parent.parent.name, path.parent.name
    assert course in checks.REGISTRY and step in checks.REGISTRY[course], f"{_id(path)}: no such step"
    ns = checks.load_exercises(path)
    assert "EXPECT" not in ns, f"{_id(path)}: a correct alternative expects no message"
    try:
        checks.check(course, step, ns)
    except checks.CheckFailed as error:
        pytest.fail(f"{_id(path)}: the checker rejected this correct answer: {error}")
