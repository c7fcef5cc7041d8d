"""Atomic file writes: a file is either its old version or its complete new version, never half of one.

Every writer of checkpoints and JSON results goes through :func:`atomic_write`:

1. a temporary file with a *unique* name is created in the same folder (``tempfile.mkstemp``), so two
   processes writing the same path never write into the same temporary file;
2. the content is written and ``fsync``-ed (on disk, not only in the page cache);
3. ``os.replace`` puts it in place in one step (atomic on POSIX file systems);
4. the folder is ``fsync``-ed, so the rename itself survives a crash of the machine.

On any failure the temporary file is removed and the old file (if any) is left untouched.
"""
from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _fsync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable. Some file systems cannot open a folder: then nothing more can be done."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # e.g. EINVAL on file systems that do not support fsync on a folder
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike, write: Callable[[Path], Any], *, make_parents: bool = True) -> Path:
    """Write ``path`` atomically: ``write(tmp)`` writes the whole content to the temporary file ``tmp``
    (a path in the same folder, already created and empty), e.g. ``lambda tmp: torch.save(state, tmp)``.

    Returns ``path``. The folder is created when ``make_parents``. Anything ``write`` raises is raised again,
    after the temporary file is removed; ``path`` then still holds its previous content.
    """
    path = Path(path)
    if make_parents:
        path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        write(tmp)
        fd = os.open(tmp, os.O_RDWR)
        try:
            os.fsync(fd)  # the content is on disk before the name points at it
        finally:
            os.close(fd)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600 files; give the usual permissions
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_folder(path.parent)
    return path


def atomic_write_text(path: str | os.PathLike, text: str, *, encoding: str = "utf-8") -> Path:
    """:func:`atomic_write` of a string."""
    data = text.encode(encoding)
    return atomic_write(path, lambda tmp: tmp.write_bytes(data))


def _read_umask() -> int:
    mask = os.umask(0o022)  # the only way to read it is to set it: done once, at import
    os.umask(mask)
    return mask


_UMASK = _read_umask()
