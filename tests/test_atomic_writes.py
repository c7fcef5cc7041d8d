"""dlo.runtime.atomic under the failures that reach a long training: an interrupt, a full disk, a writer killed
mid-write; and where its temporary file lives (beside the target, never in $TMPDIR)."""
from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from conftest import mount_tmpfs as _mount_tmpfs

import dlo  # noqa: F401
from dlo.runtime import atomic

fcntl = pytest.importorskip("fcntl")


def _temporaries(folder: Path, name: str) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if atomic._temporary_name(name).fullmatch(p.name))


def test_an_interrupt_mid_write_removes_the_temporary_file_and_keeps_the_old_content(tmp_path):
    path = tmp_path / "ckpt.pt"
    path.write_bytes(b"old")

    def interrupted(tmp):
        tmp.write_bytes(b"half of the new")
        raise KeyboardInterrupt  # the notebook's stop button

    with pytest.raises(KeyboardInterrupt):
        atomic.atomic_write(path, interrupted)
    assert path.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt"]


def test_the_temporary_file_is_beside_the_target_never_in_tmpdir(tmp_path, monkeypatch):
    """A temporary file in $TMPDIR (often another file system) would make the final rename a copy: not atomic."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.setenv("TMPDIR", str(elsewhere))
    monkeypatch.setattr(tempfile, "tempdir", str(elsewhere))
    target = tmp_path / "out" / "results.json"
    seen = []

    def write(tmp):
        seen.append(tmp)
        tmp.write_text("{}")

    atomic.atomic_write(target, write)
    assert [p.parent for p in seen] == [target.parent] and seen[0].name.startswith(".results.json.")
    assert list(elsewhere.iterdir()) == [] and target.read_text() == "{}"


def test_a_full_disk_says_no_space_left_naming_the_file_and_keeps_the_old_one(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.pt"
    path.write_bytes(b"old")

    def python_full(tmp):
        tmp.write_bytes(b"part")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def torch_full(tmp):  # what torch.save says on a full disk
        tmp.write_bytes(b"part")
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 1344 vs 1238")

    for writer, free in ((python_full, 10 << 30), (torch_full, 4096)):
        monkeypatch.setattr(atomic, "_free_bytes", lambda folder, free=free: free)
        with pytest.raises(OSError) as err:
            atomic.atomic_write(path, writer)
        assert err.value.errno == errno.ENOSPC and f"no space left on {path}" in str(err.value)
        assert "\n" not in str(err.value)
        assert path.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt"]
    monkeypatch.setattr(atomic, "_free_bytes", lambda folder: 10 << 30)  # plenty of space: torch's error as it is
    with pytest.raises(RuntimeError, match="unexpected pos"):
        atomic.atomic_write(path, torch_full)
    monkeypatch.setattr(atomic, "_free_bytes", lambda folder: 0)  # not an I/O error: never called a full disk
    with pytest.raises(ValueError, match="bad state"):
        atomic.atomic_write(path, lambda tmp: (_ for _ in ()).throw(ValueError("bad state")))


def test_a_checkpoint_on_a_real_full_disk_keeps_the_previous_one_and_says_why():
    """On a 256 KiB tmpfs (needs root): a checkpoint that does not fit is "no space left on <path>", not torch's
    "unexpected pos"; the previous checkpoint is kept whole and no temporary file is left."""
    import torch

    from dlo.training.checkpoint import read_checkpoint, save_checkpoint

    folder = Path(tempfile.mkdtemp(prefix="dlo-full-disk-"))
    if not _mount_tmpfs(folder, "256k"):
        folder.rmdir()
        pytest.skip("mounting a small tmpfs needs root")
    try:
        path = folder / "last.pt"
        small = torch.nn.Linear(50, 50)
        save_checkpoint(path, model=small, step=1)
        with pytest.raises(OSError) as err:
            save_checkpoint(path, model=torch.nn.Linear(300, 300), step=2)
        assert err.value.errno == errno.ENOSPC and f"no space left on {path}" in str(err.value)
        assert "unexpected pos" not in str(err.value) and "\n" not in str(err.value)
        assert read_checkpoint(path)["step"] == 1 and sorted(p.name for p in folder.iterdir()) == ["last.pt"]
        # the space of the temporary file is given back even while the error is kept (torch.save's writer, in the
        # error's frames, held the removed file open)
        assert shutil.disk_usage(folder).free > 128 << 10
    finally:
        if subprocess.run(["umount", str(folder)], capture_output=True, timeout=60).returncode:
            subprocess.run(["umount", "-l", str(folder)], capture_output=True, timeout=60)  # a file still open
        shutil.rmtree(folder, ignore_errors=True)


_KILLED_MID_CHECKPOINT = textwrap.dedent("""
    import os, signal, sys
    import torch
    import dlo
    from dlo.training.checkpoint import save_checkpoint

    real_save = torch.save

    def save_then_die(obj, f, *args, **kwargs):  # the content is written, then the job is killed (SIGKILL)
        real_save(obj, f, *args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)

    torch.save = save_then_die
    save_checkpoint(sys.argv[1], model=torch.nn.Linear(3, 3), step=7)
""")


def test_a_writer_killed_mid_checkpoint_leaves_a_temporary_file_that_the_next_write_removes(tmp_path):
    """SIGKILL mid-checkpoint: the writer cannot remove its temporary file. The next successful write of the same
    checkpoint removes it, and only files of the writer's own temporary pattern for that checkpoint whose writer is
    gone: not one a live writer holds, not one just created, not another target's, not a lookalike name."""
    import torch

    from dlo.training.checkpoint import read_checkpoint, save_checkpoint

    path = tmp_path / "last.pt"
    res = subprocess.run([sys.executable, "-c", _KILLED_MID_CHECKPOINT, str(path)], capture_output=True, timeout=300)
    assert res.returncode == -signal.SIGKILL, res.stderr.decode()[-2000:]
    left = _temporaries(tmp_path, "last.pt")
    assert len(left) == 1 and not path.exists()  # the killed writer's temporary file, for ever so far

    live = tmp_path / ".last.pt.abcd1234.tmp"  # a writer still at work holds a lock on its temporary file
    live.write_bytes(b"being written")
    live_fd = os.open(live, os.O_RDWR)
    fcntl.flock(live_fd, fcntl.LOCK_EX)
    fresh = tmp_path / ".last.pt.zzzz9999.tmp"  # just created, its writer not yet holding its lock
    fresh.touch()
    others = [".other.pt.abcd1234.tmp", ".last.pt.abcd1234.tmp.bak", "last.pt.abcd1234.tmp", ".last.pt.abc.tmp"]
    for name in others:
        (tmp_path / name).write_bytes(b"not ours")
    try:
        save_checkpoint(path, model=torch.nn.Linear(3, 3), step=8)
        assert read_checkpoint(path)["step"] == 8
        assert left[0] not in os.listdir(tmp_path)  # the dead writer's file is gone
        assert live.exists() and fresh.exists() and all((tmp_path / n).exists() for n in others)
    finally:
        os.close(live_fd)  # that writer dies too
    os.utime(fresh, (0, 0))  # long ago: its writer never came back
    atomic.atomic_write_text(path, "again")
    assert not live.exists() and not fresh.exists() and all((tmp_path / n).exists() for n in others)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["last.pt", *others])
