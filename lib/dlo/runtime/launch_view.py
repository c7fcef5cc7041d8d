"""What a launch shows while it runs and when it fails: the ranks' lines, not their tracebacks.

When a rank fails, its traceback (20-40 lines), its peers' "Connection closed by peer" tracebacks and the
launcher's own report (torchrun prints one more block per rank) used to stream into the notebook cell before the
one line that mattered, which came last. A student reads the top of a cell; a cluster user greps a log. So, by
default, :func:`dlo.runtime.launch`

- shows each rank's lines as they come, but from the first line of a rank's traceback on, that rank's lines are
  held back (it is failing), and the launcher's own ``[torchrun]`` / ``[srun]`` report is held back too
  (:class:`FoldedOutput`);
- raises :class:`RanksFailed`: one line per failed rank with the exception it ended with, and the path of
  ``launch.log``, which has every line (tracebacks included). ``str(err)`` is the launcher's one line (the first
  failing rank, its exit code, its last line), and the attributes are :class:`LaunchError`'s.

``launch(..., tracebacks=True)`` streams everything, as before.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from dlo.runtime.launch_report import LaunchError

_RANK_LINE = re.compile(r"^\[rank(\d+)\] ?(.*)$", re.S)
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Failed|NotImplemented\w*)\b.*")
_TRACEBACK_START = "Traceback (most recent call last)"


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
        if not any(ln.startswith(_TRACEBACK_START) for ln in lines):
            continue
        exceptions = [ln for ln in lines if _EXCEPTION_LINE.match(ln)]
        failed[rank] = exceptions[-1] if exceptions else next((ln for ln in reversed(lines) if ln.strip()), "")
    if err.rank is not None and err.rank not in failed:
        failed[err.rank] = err.last_line or "(no output)"
    if err.rank is not None:  # the launcher's verdict (the first failing rank) comes first
        failed = {err.rank: failed[err.rank], **{r: line for r, line in failed.items() if r != err.rank}}
    return failed


def folded(err: LaunchError, script: str | Path, nproc: int) -> RanksFailed:
    """``err`` as :class:`RanksFailed`: one line per failed rank, then where every rank's output is."""
    if isinstance(err, RanksFailed):
        return err
    ranks = {} if err.timed_out else failed_ranks(err)
    log = Path(err.records_dir) / "launch.log" if err.records_dir is not None else None
    lines = [f"rank {rank} failed: {line}" for rank, line in ranks.items()]
    lines.append(str(err) if not ranks else f"{Path(script).name} on {nproc} processes failed; every rank's "
                 f"output: {log}")
    return RanksFailed(err, lines)


class FoldedOutput:
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
        if m.group(2).startswith(_TRACEBACK_START):
            self.failing.add(rank)
        return rank not in self.failing

    def flush(self) -> None:
        if self.partial and self.keep(self.partial):
            self.target.write(self.partial)
        self.partial = ""
        self.target.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.target, name)
