"""Atomic file writes: a file is either its old version or its complete new version, never half of one.

Every writer of checkpoints and JSON results goes through :func:`atomic_write`:

1. a temporary file with a *unique* name is created in the same folder (``tempfile.mkstemp``), so two
   processes writing the same path never write into the same temporary file;
2. the content is written and ``fsync``-ed (on disk, not only in the page cache);
3. ``os.replace`` puts it in place in one step (atomic on POSIX file systems);
4. the folder is ``fsync``-ed, so the rename itself survives a crash of the machine.

On any failure (an interrupt included) the temporary file is removed and the old file (if any) is left
untouched; a full disk says so, naming the file. A writer killed mid-write (SIGKILL, a node lost) cannot
remove its temporary file: the next successful write of the same path removes it (see
:func:`_remove_stale_temporaries`).
"""
from __future__ import annotations

import errno
import os
import re
import shutil
import stat
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no flock, so no clean-up of a killed writer's temporary files
    fcntl = None  # type: ignore[assignment]

#: Less free space than this when a write fails: the disk was full (torch.save then only says "unexpected pos").
FULL_DISK_BYTES = 1 << 20
#: A temporary file still empty and younger than this may be one whose writer has not locked it yet: left alone.
FRESH_TEMPORARY_S = 60.0


def fsync_folder(folder: Path) -> None:
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


def _temporary_name(name: str) -> re.Pattern[str]:
    """The names :func:`atomic_write` gives the temporary files of a target called ``name`` (``tempfile.mkstemp``
    with ``prefix=".<name>."``, ``suffix=".tmp"``: eight random characters in between)."""
    return re.compile(rf"\.{re.escape(name)}\.[a-z0-9_]{{8}}\.tmp")


def _lock(fd: int) -> None:
    """Hold an exclusive ``flock`` on the temporary file while it is written: the clean-up of a later write takes a
    file it can lock for one whose writer is dead (the kernel drops the lock when its process dies)."""
    if fcntl is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # a file system without flock: then no clean-up can tell a live writer either
            pass


def _remove_stale_temporaries(path: Path, own: Path) -> list[Path]:
    """Remove the temporary files of ``path`` that writers killed mid-write left behind; returns those removed.

    Only files in ``path``'s folder named as :func:`atomic_write` names the temporary files of ``path``, regular
    files (not links) of this user, and only those no writer holds: a live writer holds a lock on its own
    temporary file, which the kernel releases when that writer dies. A file still empty and younger than
    :data:`FRESH_TEMPORARY_S` may belong to a writer that has not taken its lock yet: it is left too. Never raises.
    """
    if fcntl is None:
        return []
    pattern, removed = _temporary_name(path.name), []
    try:
        names = [e.name for e in os.scandir(path.parent) if pattern.fullmatch(e.name) and e.name != own.name]
    except OSError:
        return []
    for name in names:
        candidate = path.parent / name
        try:
            fd = os.open(candidate, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                continue
            if st.st_size == 0 and time.time() - st.st_mtime < FRESH_TEMPORARY_S:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # its writer is alive (or this file system has no flock)
            if os.stat(candidate, follow_symlinks=False).st_ino == st.st_ino:
                os.unlink(candidate)
                removed.append(candidate)
        except OSError:
            continue
        finally:
            os.close(fd)
    return removed


def _free_bytes(folder: Path) -> int | None:
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def _no_space(exc: BaseException, folder: Path) -> int | None:
    """The free bytes left when ``exc`` ended a write because the disk (or a quota) was full, else None.

    Python's own writes say ENOSPC (EDQUOT for a quota); torch.save only says "[enforce fail at
    inline_container.cc] unexpected pos": an I/O-looking error (RuntimeError, OSError) while the file system
    has almost no space left (:data:`FULL_DISK_BYTES`) is taken as a full disk too."""
    full = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}
    seen, cur = set(), exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, OSError) and cur.errno in full:
            free = _free_bytes(folder)
            return 0 if free is None else free
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    if isinstance(exc, (RuntimeError, OSError)):
        free = _free_bytes(folder)
        if free is not None and free < FULL_DISK_BYTES:
            return free
    return None


def _release_frames(exc: BaseException) -> None:
    """Clear the local variables of the finished frames of ``exc`` and of the errors it was raised from."""
    seen, cur = set(), exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        traceback.clear_frames(cur.__traceback__)
        cur = cur.__cause__ or cur.__context__


def atomic_write(path: str | os.PathLike, write: Callable[[Path], Any], *, make_parents: bool = True) -> Path:
    """Write ``path`` atomically: ``write(tmp)`` writes the whole content to the temporary file ``tmp``
    (a path in the same folder, already created and empty), e.g. ``lambda tmp: torch.save(state, tmp)``.

    Returns ``path``. The folder is created when ``make_parents``. Anything ``write`` raises is raised again,
    after the temporary file is removed (a KeyboardInterrupt too); ``path`` then still holds its previous content.
    A full disk is ``OSError(ENOSPC)`` "no space left on <path>", whatever the writer said. The temporary file is
    always in ``path``'s own folder, never in ``$TMPDIR``: a rename across file systems is a copy, not atomic.
    After a successful write, the temporary files of ``path`` left by writers killed mid-write are removed.
    """
    path = Path(path)
    if make_parents:
        path.parent.mkdir(parents=True, exist_ok=True)
    lock_fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        _lock(lock_fd)
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
        except BaseException as exc:
            free = _no_space(exc, path.parent) if isinstance(exc, Exception) else None  # before the space is freed
            if free is not None:
                # torch.save's writer, left in the frames of its error, keeps the temporary file open: removed, it
                # would still hold its space (and the file system busy) for as long as the error is kept
                _release_frames(exc)
            tmp.unlink(missing_ok=True)
            if free is not None:
                raise OSError(errno.ENOSPC, f"no space left on {path} (its file system has {free} bytes free): "
                                            "its previous content is kept; free some space and write it again") from exc
            raise
        fsync_folder(path.parent)
    finally:
        os.close(lock_fd)
    _remove_stale_temporaries(path, tmp)
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
