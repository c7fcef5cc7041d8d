"""Where a sharded checkpoint lives on disk, so that it is whole or absent.

A sharded save is written by every rank at once; a rank killed half-way must never leave a folder that loads as a
mix of two saves. So :func:`dlo.parallel.fsdp.save_sharded` never writes into a checkpoint that exists:

1. every rank writes its shards into ``<root>/.partial-step-<N>/`` (fsynced, as torch.distributed.checkpoint does);
2. after a barrier (every rank has finished), rank 0 writes the commit marker ``COMPLETE.json`` last, listing every
   file of the save with its size (fsynced), then renames the folder to ``<root>/step-<N>/`` (one atomic rename,
   the folder fsynced): that rename is the commit;
3. the previous complete checkpoints are removed only after it (``keep`` newest are kept).

Loading (:func:`newest_complete`) takes the newest ``step-<N>`` folder whose marker is there and whose files match
it; anything else (a ``.partial-*`` folder, a step folder without its marker or with a file missing or cut) is
named and never loaded. A folder written by ``dcp.save`` directly (a ``.metadata`` in ``<root>`` itself) is read as
it is, as before.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import NamedTuple

from dlo.runtime.atomic import atomic_write_text, fsync_folder

MARKER = "COMPLETE.json"
_STEP = re.compile(r"^step-(\d{9})$")
_PARTIAL = re.compile(r"^\.partial-step-(\d{9})$")


def step_folder(root: str | os.PathLike, step: int) -> Path:
    return Path(root) / f"step-{step:09d}"


def partial_folder(root: str | os.PathLike, step: int) -> Path:
    return Path(root) / f".partial-step-{step:09d}"


def _files(folder: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.is_file() and p.name != MARKER}


def commit(partial: Path, target: Path, step: int, world_size: int) -> Path:
    """Rank 0, after every rank has written into ``partial``: the marker last, then the rename that commits."""
    files = _files(partial)
    if ".metadata" not in files:
        raise RuntimeError(f"{partial}: no .metadata after every rank finished: the save is incomplete, not committed")
    atomic_write_text(partial / MARKER, json.dumps({"step": step, "world_size": world_size, "files": files}))
    fsync_folder(partial)
    if target.exists():  # the same step saved again: the older copy goes first (named, never loaded meanwhile)
        aside = target.with_name(f".replaced-{target.name}")
        shutil.rmtree(aside, ignore_errors=True)
        os.replace(target, aside)
        os.replace(partial, target)
        shutil.rmtree(aside, ignore_errors=True)
    else:
        os.replace(partial, target)
    fsync_folder(target.parent)
    return target


def prune(root: Path, keep: int) -> list[Path]:
    """Removes all but the ``keep`` newest complete step folders, and incomplete folders older than the newest
    complete one; returns what it removed."""
    complete = [f for f, problem in _step_folders(root) if problem is None]
    removed = [f for f in complete[keep:]]
    if complete:
        newest = _step_of(complete[0])
        removed += [f for f in _incomplete(root) if _step_of(f) is not None and _step_of(f) < newest]
    for folder in removed:
        shutil.rmtree(folder, ignore_errors=True)
    return removed


def _step_of(folder: Path) -> int | None:
    m = _STEP.match(folder.name) or _PARTIAL.match(folder.name)
    return int(m.group(1)) if m else None


def _problem(folder: Path, root: Path) -> str | None:
    """Why ``folder`` is not a complete checkpoint, or None."""
    if not folder.resolve().is_relative_to(root.resolve()):
        return "it is a link to a folder outside the checkpoint folder"
    marker = folder / MARKER
    if not marker.is_file():
        return f"no {MARKER} (the save did not finish)"
    try:
        record = json.loads(marker.read_text())
        files, step = record["files"], record["step"]
        if not isinstance(files, dict) or not isinstance(step, int) or step != _step_of(folder):
            raise ValueError("unexpected content")
    except (OSError, ValueError, KeyError, TypeError):
        return f"its {MARKER} is damaged"
    for name, size in files.items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != size:
            return f"{name} has {path.stat().st_size} bytes, the save wrote {size}"
    return None


def _step_folders(root: Path) -> list[tuple[Path, str | None]]:
    """Every ``step-<N>`` folder of ``root``, newest first, with why it is not complete (None: complete)."""
    if not root.is_dir():
        return []
    found = sorted((f for f in root.iterdir() if _STEP.match(f.name) and f.is_dir()), key=_step_of, reverse=True)
    return [(f, _problem(f, root)) for f in found]


def _incomplete(root: Path) -> list[Path]:
    return sorted((f for f in root.iterdir() if _PARTIAL.match(f.name) and f.is_dir()), key=_step_of, reverse=True)


class Choice(NamedTuple):
    folder: Path  # what to load: a complete step folder, or the root itself (a folder dcp.save wrote directly)
    left_out: list[str]  # one phrase per folder that is not loaded, and why

    def describe(self) -> str:
        skipped = f"; left out: {'; '.join(self.left_out)}" if self.left_out else ""
        return f"loading {self.folder.name} (the newest complete checkpoint){skipped}"


def newest_complete(root: str | os.PathLike) -> Choice:
    """The folder a resume loads: the newest complete ``step-<N>`` of ``root`` (the newer incomplete ones named in
    ``left_out``), or ``root`` itself when it is a folder ``dcp.save`` wrote directly. FileNotFoundError in one line
    when there is none."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"no sharded checkpoint at {root}: save one first (save_sharded)")
    skipped = [(f, f"{f.name} is incomplete: no {MARKER} (the save did not finish)") for f in _incomplete(root)]
    for folder, problem in _step_folders(root):
        if problem is None:
            newer = [why for f, why in skipped if _step_of(f) >= _step_of(folder)]
            return Choice(folder, newer)
        skipped.append((folder, f"{folder.name}: {problem}"))
    if (root / ".metadata").exists():
        return Choice(root, [])
    why = f" ({'; '.join(w for _, w in skipped)})" if skipped else ""
    raise FileNotFoundError(f"no complete sharded checkpoint in {root}{why}: nothing to resume from")
