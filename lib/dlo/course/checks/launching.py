"""Launching a script whose parts a student writes: its checks first, and one line per failed rank.

A launch of ``dp_scratch_train.py`` with steps still to write used to run for half a minute, then print every
rank's traceback and torchrun's report (some 70 lines) before the one line that mattered. :func:`launch_checked`
instead

1. runs the checks of the steps the ranks need (the notebook's check cells, :func:`dlo.course.checks.check`; an
   unwritten step fails at once, and a passing step's multi-process check is cached per script content, so
   after the check cells this costs nothing) and refuses the launch in one line naming every step not passing;
2. launches (:func:`dlo.runtime.launch`) with the ranks' lines shown as they come, except tracebacks and the
   launcher's own report: when ranks fail, the cell shows one line per failed rank and the log's path (the whole
   output is in that log), as :class:`RanksFailed`, whose message is the launcher's one line.
"""
from __future__ import annotations

import contextlib
import io
import re
import sys
from pathlib import Path
from typing import Any, Sequence

from dlo.course.checks.framework import REGISTRY, CheckFailed, check
from dlo.course.exercises import load_exercises
from dlo.runtime.launch import LaunchError, launch

_RANK_LINE = re.compile(r"^\[rank(\d+)\] ?(.*)$", re.S)
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Failed|NotImplemented\w*)\b.*")


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


class RanksFailed(LaunchError):
    """A launch whose ranks failed: one line per failed rank and the log's path, no traceback (IPython shows
    :meth:`_render_traceback_`); ``str()`` is the launcher's one line, and the attributes are LaunchError's."""

    def __init__(self, err: LaunchError, lines: list[str]) -> None:
        super().__init__(str(err), rank=err.rank, exit_code=err.exit_code, last_line=err.last_line, log=err.log,
                         command=err.command, records_dir=err.records_dir, timed_out=err.timed_out)
        self.lines = lines

    def _render_traceback_(self) -> list[str]:
        return list(self.lines)


def failed_ranks(err: LaunchError) -> dict[int, str]:
    """``{rank: the exception it ended with}`` for every rank whose output has a traceback (the rank the
    launcher blames is always there, with its last line); ranks stopped after another one failed are not."""
    per_rank: dict[int, list[str]] = {}
    for line in err.log.splitlines():
        m = _RANK_LINE.match(line)
        if m:
            per_rank.setdefault(int(m.group(1)), []).append(m.group(2).rstrip())
    failed = {}
    for rank, lines in sorted(per_rank.items()):
        if not any(ln.startswith("Traceback (most recent call last)") for ln in lines):
            continue
        exceptions = [ln for ln in lines if _EXCEPTION_LINE.match(ln)]
        failed[rank] = exceptions[-1] if exceptions else next((ln for ln in reversed(lines) if ln.strip()), "")
    if err.rank is not None and err.rank not in failed:
        failed[err.rank] = err.last_line or "(no output)"
    return dict(sorted(failed.items()))


class _WithoutTracebacks:
    """``sys.stdout`` during a launch: the launcher's lines pass, except a rank's traceback (from its first line
    on, that rank's lines are held back: it is failing) and the launcher's own ``[torchrun]`` / ``[srun]`` report."""

    def __init__(self, target: Any) -> None:
        self.target = target
        self.partial = ""
        self.failing: set[int] = set()

    def write(self, text: str) -> int:
        *lines, self.partial = (self.partial + text).split("\n")
        for line in lines:
            if self.keep(line):
                self.target.write(line + "\n")
        return len(text)

    def keep(self, line: str) -> bool:
        if line.startswith(("[torchrun]", "[srun]")):
            return False
        m = _RANK_LINE.match(line)
        if m is None:
            return True
        rank = int(m.group(1))
        if m.group(2).startswith("Traceback (most recent call last)"):
            self.failing.add(rank)
        return rank not in self.failing

    def flush(self) -> None:
        self.target.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.target, name)


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
    out = sys.stdout
    filtered = _WithoutTracebacks(out)
    try:
        sys.stdout = filtered
        try:
            return launch(script, list(args), nproc, **kwargs)
        finally:
            sys.stdout = out
    except LaunchError as err:
        ranks = failed_ranks(err)
        log = Path(err.records_dir) / "launch.log" if err.records_dir is not None else None
        lines = [f"rank {rank} failed: {line}" for rank, line in ranks.items()]
        lines.append(str(err) if not ranks else f"{Path(script).name} on {nproc} processes failed; every rank's "
                     f"output: {log}")
        raise RanksFailed(err, lines) from None
