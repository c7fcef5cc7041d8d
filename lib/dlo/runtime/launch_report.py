"""Error reports of a launch: which rank failed first, and what it said last, in one line.

When one rank of a distributed run fails, its peers fail too a moment later ("Connection closed by peer": the
consequence, never the cause), and a launcher that reports the last failure, or rank 0's, sends a student to
the wrong traceback. The ranks leave evidence behind -- their exit codes, their output, and the failure notes
that :mod:`dlo.runtime.records` writes as an exception leaves a rank -- and :func:`_first_failure` weighs it:
the earliest failure of a rank's own wins. :class:`LaunchError` carries the verdict as one line, the details
as attributes.
"""
from __future__ import annotations

import contextlib
import json
import re
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dlo.runtime.records import _FAILURES_SUBDIR

class LaunchError(RuntimeError):
    """A launched run failed. ``str(err)`` is one line; the details are attributes.

    ``rank`` / ``exit_code`` / ``last_line``: the rank blamed (None if unknown) and what it said last;
    ``log``: every output line, rank-prefixed; ``command``: what was run; ``records_dir``: where the
    records, ``launch.log`` and torchrun's per-rank logs are; ``timed_out``: True when stopped by ``timeout_s``.
    """

    def __init__(
        self,
        message: str,
        *,
        rank: int | None = None,
        exit_code: int | None = None,
        last_line: str = "",
        log: str = "",
        command: Sequence[str] = (),
        records_dir: Path | None = None,
        timed_out: bool = False,
    ):
        super().__init__(message)
        self.rank = rank
        self.exit_code = exit_code
        self.last_line = last_line
        self.log = log
        self.command = list(command)
        self.records_dir = records_dir
        self.timed_out = timed_out




_TORCHRUN_PREFIX = re.compile(r"^\[[A-Za-z_][A-Za-z_]*?(\d+)\]:(.*)$", re.S)  # "[default1]:text"
_SRUN_PREFIX = re.compile(r"^\s*(\d+): ?(.*)$", re.S)  # " 1: text" (srun --label)
_TORCHRUN_FAILURE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")
_SRUN_FAILURE = re.compile(r"task (\d+): Exited with exit code (\d+)")


def _last_meaningful(lines: Sequence[str]) -> str:
    """The exception line after the last traceback, else the last non-blank line."""
    for start in range(len(lines) - 1, -1, -1):
        if lines[start].startswith("Traceback (most recent call last)"):
            for line in lines[start + 1 :]:
                if line.strip() and not line[0].isspace():
                    return line.strip()
            break
    for line in reversed(lines):
        if line.strip():
            return line.strip()
    return ""


#: What a rank says when a peer it was talking to is gone: the consequence of another rank's failure, never its cause.
_PEER_LOST = re.compile(
    r"connection closed by peer|connection reset by peer|broken pipe|remote (?:worker|process|peer)|"
    r"peer crash|connection was likely closed|communicator was aborted|ECONNRESET|EPIPE",
    re.I,
)


def _peer_lost(line: str) -> bool:
    """Whether ``line`` (an exception's first line) says that a peer vanished, not what went wrong itself."""
    return bool(_PEER_LOST.search(line or ""))


def _code_text(code: int | None) -> str:
    """``1``; ``-9 (killed by SIGKILL)`` for a rank killed by a signal."""
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"{code} (killed by {signal.Signals(-code).name})"
    return str(code)


def _first_failure(
    codes: Mapping[int, int | None],
    stopped: set[int],
    notes: Sequence[Mapping[str, Any]],
    per_rank: Mapping[int, Sequence[str]],
    exited_at: Mapping[int, float] | None = None,
) -> tuple[int, str] | None:
    """The rank that failed first and its last line, from what each rank left behind; None if nothing failed.

    ``codes``: each rank's exit code where known; ``stopped``: ranks the launcher itself stopped (their codes say
    nothing of their own); ``notes``: the failure notes (rank, time, exception) the ranks wrote as they failed;
    ``exited_at``: when each rank was seen to exit (time.time()), where the launcher saw it.

    1. A rank that failed on its own: a note whose exception is not the loss of a peer ("Connection closed by
       peer", "Broken pipe": that is what the others say once the first one is gone), or a rank that exited with
       an error and no note (a signal, ``os._exit``, ``sys.exit``, a crash in C), its last line not a peer's
       loss either. The earliest wins: a note's time, or when its rank was seen to exit (a late upper bound: a
       rank without a note is preferred only when surely earlier); without exit times, notes first, then the
       lowest rank.
    2. Else the earliest note (a peer's loss), else the lowest rank that exited with an error on its own, else
       the lowest rank stopped by the launcher.
    """
    exited_at = exited_at or {}
    first_note: dict[int, Mapping[str, Any]] = {}
    for note in sorted(notes, key=lambda n: n.get("time", 0)):
        with contextlib.suppress(TypeError, ValueError):
            first_note.setdefault(int(note["rank"]), note)
    last = {r: _last_meaningful(per_rank.get(r, [])) for r in set(codes) | set(first_note)}
    own: list[tuple[float, int, int, str]] = []  # (time, evidence order, rank, line)
    for rank, note in first_note.items():
        if not _peer_lost(str(note.get("exception", ""))):
            own.append((float(note.get("time", 0)), 0, rank, str(note.get("exception", ""))))
    for rank, code in codes.items():
        if rank in first_note or rank in stopped or code in (None, 0) or _peer_lost(last[rank]):
            continue
        when = exited_at.get(rank, float("inf"))
        own.append((when, 1, rank, last[rank]))
    if own:
        _, _, rank, line = min(own)
        return rank, line
    if first_note:
        rank, note = min(first_note.items(), key=lambda rn: rn[1].get("time", 0))
        return rank, str(note.get("exception", ""))
    failed = [r for r, c in codes.items() if c not in (None, 0)]
    if not failed:
        return None
    rank = min([r for r in failed if r not in stopped] or failed)
    return rank, last[rank]


def _blame(
    own_lines: Sequence[str],
    per_rank: Mapping[int, Sequence[str]],
    notes: Sequence[Mapping[str, Any]],
    srun: bool,
    returncode: int,
) -> tuple[int | None, int | None, str]:
    """Which rank to blame for a failed torchrun or srun run: ``(rank or None, exit code, last meaningful line)``.

    The exit codes come from the launcher's own report (torchrun's "rank : 1 ... exitcode : 1" summary, srun's
    "task 1: Exited with exit code 1"); ranks that torchrun stopped itself once another had failed end with
    SIGTERM (-15). :func:`_first_failure` weighs them with the ranks' failure notes. Else nobody in particular:
    the launcher's own last line (it may not have started any rank).
    """
    text = "\n".join(own_lines)
    codes = {int(r): int(c) for r, c in (_SRUN_FAILURE if srun else _TORCHRUN_FAILURE).findall(text)}
    stopped = set() if srun else {r for r, c in codes.items() if c == -signal.SIGTERM}
    found = _first_failure(codes, stopped, notes, per_rank)
    if found is None:
        return None, returncode, _last_meaningful(own_lines)
    rank, line = found
    return rank, codes.get(rank, returncode), line



def _without_own_prefix(line: str, rank: int) -> str:
    """``line`` without torch.distributed's own ``[rank1]: `` prefix (it adds one to uncaught-exception lines):
    the launcher prefixes every line itself, and one prefix is enough."""
    own = f"[rank{rank}]:"
    return line[len(own):].removeprefix(" ") if line.startswith(own) else line



def _read_lines(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []


def _fresh_notes(folder: Path, started: float) -> list[dict]:
    """The failure notes the ranks of this run wrote in ``folder`` (a note older than ``started`` was left by an
    earlier run in the same folder: it says nothing about this one)."""
    notes = []
    for path in sorted((folder / _FAILURES_SUBDIR).glob("rank*.json")):
        with contextlib.suppress(ValueError, OSError):
            note = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(note, dict) and float(note.get("time", 0)) >= started:
                notes.append(note)
    return notes
