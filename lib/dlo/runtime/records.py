"""JSON records written by each rank (``<dir>/rank<r>.jsonl``) and read back by the launcher, and the
excepthook that records a rank's failure so that the launcher can say which rank failed first and why.
"""
from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from dlo.runtime.atomic import atomic_write_text
from dlo.runtime.errors import first_line
from dlo.runtime.context import rank_and_world, dist_context
RECORDS_ENV = "DLO_RECORDS_DIR"
_FAILURES_SUBDIR = "failures"  # <records_dir>/failures/rank<r>.json, written by the excepthook below
_RECORD_FILE = re.compile(r"^rank(\d+)\.jsonl$")


def _jsonable(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        return value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if hasattr(value, "tolist"):  # numpy arrays and scalars, without importing numpy here
        return value.tolist()
    raise TypeError(
        f"record value of type {type(value).__name__} is not JSON-serialisable: "
        "convert it first (float(x), x.tolist(), str(x))"
    )


def write_record(record: Mapping[str, Any], records_dir: str | os.PathLike | None = None) -> Path | None:
    """Append ``record`` (plus ``rank`` and ``world_size``) as one JSON line to ``<dir>/rank<r>.jsonl``.

    ``dir`` defaults to ``$DLO_RECORDS_DIR``, which :func:`launch` sets for the ranks it starts. When it
    is unset the call does nothing and returns None, so the same script also runs standalone. One file
    per rank means no two processes ever write to the same file. Returns the file written.
    """
    if not isinstance(record, Mapping):
        raise ValueError(f"record must be a dict, got {type(record).__name__}")
    target = records_dir if records_dir is not None else os.environ.get(RECORDS_ENV)
    if not target:
        return None
    rank, world = rank_and_world()
    for key, actual in (("rank", rank), ("world_size", world)):
        if key in record and record[key] != actual:
            raise ValueError(
                f"record has {key}={record[key]!r} but this process has {key}={actual}: "
                "drop that key, it is added for you"
            )
    line = json.dumps({**record, "rank": rank, "world_size": world}, default=_jsonable)
    folder = Path(target)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"rank{rank}.jsonl"
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(line + "\n")
    return path


def read_records(records_dir: str | os.PathLike | None = None) -> list[dict]:
    """All records under ``records_dir`` (default ``$DLO_RECORDS_DIR``), sorted by rank, then write order."""
    target = records_dir if records_dir is not None else os.environ.get(RECORDS_ENV)
    if not target:
        raise ValueError(f"no records folder given and ${RECORDS_ENV} is not set: pass read_records(path)")
    folder = Path(target)
    if not folder.is_dir():
        raise ValueError(f"records folder {folder} does not exist: check the path launch() returned or printed")
    files = sorted(
        ((int(m.group(1)), p) for p in folder.iterdir() if (m := _RECORD_FILE.match(p.name))), key=lambda rp: rp[0]
    )
    out: list[dict] = []
    for _, path in files:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(
                    f"{path}:{number} is not valid JSON ({exc.msg}): was that rank killed while writing?"
                ) from None
    return out


#: (pid, failures folder) pairs this process has already written its note into: a rank fails once, first.
_noted: set[tuple[int, str]] = set()


def note_failure(exc: BaseException) -> None:
    """Note, now, that this rank failed with ``exc`` (when running under :func:`launch`; otherwise nothing).

    The note (``<records>/failures/rank<r>.json``: rank, float time, pid, the exception's first line) lets the
    launcher blame the rank that failed first. Only a process's first failure is noted: the excepthook that
    sees the same exception later, at the top of the script, keeps the earlier note and its earlier time.
    :func:`dlo.runtime.distributed` calls it before it destroys the process group; destroying the group first
    closes the connections of the peers, which then fail ("Connection closed by peer") before this rank's note
    is written, and the launcher would blame them. Never raises: a failing diagnostic must not hide the error.
    """
    records = os.environ.get(RECORDS_ENV)
    if not records:
        return
    folder = Path(records) / _FAILURES_SUBDIR
    key = (os.getpid(), str(folder))
    if key in _noted:
        return
    try:
        rank = dist_context().rank
        folder.mkdir(parents=True, exist_ok=True)
        note = {"rank": rank, "time": time.time(), "pid": os.getpid(), "exception": first_line(exc)}
        atomic_write_text(folder / f"rank{rank}.json", json.dumps(note))  # never half a note
        _noted.add(key)
    except Exception:  # noqa: BLE001 - a failing diagnostic must never hide the real exception
        pass


def _install_failure_hook() -> None:
    """When running under :func:`launch`, note the time and message of an uncaught exception.

    When rank 1 crashes, rank 0 usually crashes a few milliseconds later with "Connection closed by
    peer" while waiting for it. torchrun only knows exit times to the second, so it cannot tell which
    came first; this note (float timestamp, see :func:`note_failure`) lets :func:`launch` blame the rank that
    really failed first.
    """
    records = os.environ.get(RECORDS_ENV)
    if not records or getattr(sys.excepthook, "_dlo_failure_hook", False):
        return
    previous = sys.excepthook

    def hook(etype, value, tb):
        note_failure(value if value is not None else etype())
        previous(etype, value, tb)

    hook._dlo_failure_hook = True  # type: ignore[attr-defined]
    sys.excepthook = hook


_install_failure_hook()  # a script started by launch() is covered from its first `import dlo.runtime`
