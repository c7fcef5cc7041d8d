"""Launching a script whose parts a student writes: its checks first, and one line per failed rank.

A launch of ``dp_scratch_train.py`` with steps still to write used to run for half a minute, then print every
rank's traceback and torchrun's report (some 70 lines) before the one line that mattered. :func:`launch_checked`
instead

1. runs the checks of the steps the ranks need (the notebook's check cells, :func:`dlo.course.checks.check`; an
   unwritten step fails at once, and a passing step's multi-process check is cached per script content, so
   after the check cells this costs nothing) and refuses the launch in one line naming every step not passing;
2. launches (:func:`dlo.runtime.launch`), which shows the ranks' lines as they come, except tracebacks and the
   launcher's own report: when ranks fail, the cell shows one line per failed rank and the log's path (the whole
   output is in that log), as :class:`~dlo.runtime.launch_view.RanksFailed`, whose message is the launcher's one
   line.
"""
from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any, Sequence

from dlo.course.checks.framework import REGISTRY, CheckFailed, check
from dlo.course.exercises import load_exercises
from dlo.runtime.launch import launch


def steps_not_passing(course: str, script: str | Path, steps: Sequence[str] | None = None) -> list[CheckFailed]:
    """The checks of ``course`` (``steps``, default every step) that ``script``'s exercises do not pass yet."""
    if course not in REGISTRY:
        check(course, "?")  # the one-line "unknown course" error
    steps = list(REGISTRY[course]) if steps is None else list(steps)
    if not steps:
        return []
    namespace = load_exercises(script)
    failed = []
    for step in steps:
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                check(course, step, namespace)
        except CheckFailed as exc:
            failed.append(exc)
    return failed


def launch_checked(course: str, script: str | Path, args: Sequence[str] = (), nproc: int = 2, *,
                   steps: Sequence[str] | None = None, **kwargs: Any) -> list[dict]:
    """:func:`dlo.runtime.launch` of ``script``, after the checks of ``course``'s ``steps`` (default: every
    step). A step not passing: :class:`CheckFailed` in one line (``NOT YET course/step: launch refused ...``)
    before any process starts. Ranks that fail: :class:`RanksFailed` (one line per failed rank and the log's
    path in a notebook). ``kwargs`` go to ``launch`` (``timeout_s``, ``env``, ``records_dir`` ...)."""
    failed = steps_not_passing(course, script, steps)
    if failed:
        first = failed[0]
        detail = str(first)
        detail = detail[len(f"{course}/{first.step}: "):] if detail.startswith(f"{course}/{first.step}: ") else detail
        names = ", ".join(f.step for f in failed)
        raise CheckFailed(f"launch refused: {Path(script).name} does not pass step(s) {names} yet; "
                          f"{first.step}: {detail}", course, first.step)
    return launch(script, list(args), nproc, **kwargs)
