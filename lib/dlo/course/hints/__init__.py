"""What each exercise step asks for, and hints in three levels that teach without dictating.

Every step (``course``, ``step``, as in ``dlo check --list``) has a *goal*: one or two sentences saying what
the code must achieve and why, with no code. The student copies use it for the ``TODO`` comment and the
``NotImplementedError`` message. ``dlo hint COURSE STEP`` then gives, one more each time it is called:

1. the idea, and why (``Hint.concept``);
2. the shape of the computation in words -- what is computed from what, in which order -- without its code
   (``Hint.shape``);
3. pointers to the exact API: the functions, classes and arguments to use (``Hint.tools``).

No level writes the solution's code: ``dlo solution COURSE STEP`` prints the reference solution, for instructors
(tests/test_hints_do_not_dictate.py looks for the solution's lines in the hints and the student copies).

The hints are written per workshop, one module each (:mod:`dlo.course.hints.jour1` ...); this package joins them.
"""
from __future__ import annotations

import json
from pathlib import Path

from . import experts, fsdp, jour1, jour2, jour3, jour4, pipeline, tensor
from .base import Hint
from dlo.course.catalog import unknown_name
from dlo.runtime.paths import RUNS_DIR

HINTS: dict[tuple[str, str], Hint] = {}
for _module in (jour1, jour2, jour3, jour4, fsdp, pipeline, tensor, experts):
    _clash = set(HINTS) & set(_module.HINTS)
    assert not _clash, f"hints defined twice: {sorted(_clash)}"
    HINTS.update(_module.HINTS)

# Classes a step's functions rely on, whose methods hold solution regions of that step.
HELPERS: dict[str, dict[str, tuple[str, str]]] = {
    "tp_tensor_parallel/tp_balises.py": {
        "CopyToRegion": ("tp", "1"), "ReduceFromRegion": ("tp", "1"),
        "GatherFromRegion": ("tp", "1"), "ScatterToRegion": ("tp", "1"),
        "GatherFromSequenceRegion": ("tp", "12"), "ReduceScatterToSequenceRegion": ("tp", "12"),
    },
}

LEVELS = 3


def hint_for(course: str, step: str) -> Hint:
    try:
        return HINTS[(course, step)]
    except KeyError:
        known: dict[str, list[str]] = {}
        for c, s in HINTS:
            known.setdefault(c, []).append(s)
        raise ValueError(unknown_name(course, step, known)) from None


def goal(course: str, step: str) -> str:
    return hint_for(course, step).goal


def levels(course: str, step: str) -> list[str]:
    """The three hint levels of a step: the idea, the shape of the computation, the API."""
    h = hint_for(course, step)
    shape = h.shape or "(not written for this step: read the goal again, then level 3)"
    return [f"Idea: {h.concept}", f"Shape: {shape}", f"API: {h.tools}"]


# --------------------------------------------------------------------------------------------------
# Which hint level each step has reached: `dlo hint` gives the next one each time
# --------------------------------------------------------------------------------------------------

STATE_FILE: Path = RUNS_DIR / "hints.json"  # runs/hints.json (DLO_RUNS_DIR moves it), {"course/step": level}


def _read_state(path: Path) -> dict[str, int]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, int) and 0 <= v <= LEVELS}


def next_level(course: str, step: str, level: int | None = None, state_file: str | Path | None = None) -> int:
    """The hint level to show now (the one after the last shown, or ``level``), remembered in ``state_file``."""
    return advance(course, step, level, state_file)[0]


def advance(course: str, step: str, level: int | None = None,
            state_file: str | Path | None = None) -> tuple[int, str | None]:
    """:func:`next_level`, and why the level could not be remembered (``None`` when it was): in a read-only
    checkout the hint is still shown, but the next call starts again from the same level."""
    hint_for(course, step)  # unknown steps: ValueError before anything is written
    path = Path(state_file) if state_file is not None else STATE_FILE
    state = _read_state(path)
    key = f"{course}/{step}"
    if level is None:
        level = min(state.get(key, 0) + 1, LEVELS)
    elif not 1 <= level <= LEVELS:
        raise ValueError(f"--level must be between 1 and {LEVELS}, got {level}")
    state[key] = level
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(state, indent=1, sort_keys=True) + "\n")
    except OSError as exc:
        return level, f"cannot write {path} ({exc.strerror or exc})"
    return level, None
