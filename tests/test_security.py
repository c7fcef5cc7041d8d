"""What dlo refuses to trust and how it writes: files from disk never run code when loaded (data batches,
checkpoints, pretrained weights), results are written atomically, a local process group listens only on
the loopback interface."""
from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import pytest
import torch

import dlo  # noqa: F401  (before torchvision: prepares its import)
from dlo.measure import bench
from dlo.runtime import atomic


# --------------------------------------------------------------------------------------------------
# Crafted pickles: loading one must not run its code
# --------------------------------------------------------------------------------------------------

class _WritesMarker:
    """Unpickling this object calls ``Path(marker).write_text(...)``: what an attacker's file would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "code ran"))


def _crafted_bytes(marker: Path, *, wrapped: bool = True) -> bytes:
    import pickle

    obj = {"data": _WritesMarker(marker), "labels": [0]} if wrapped else _WritesMarker(marker)
    return pickle.dumps(obj, protocol=2)


# --------------------------------------------------------------------------------------------------
# Atomic writes
# --------------------------------------------------------------------------------------------------

def _count_fsyncs(monkeypatch) -> dict[str, int]:
    counts = {"file": 0, "folder": 0}
    real = os.fsync

    def fsync(fd):
        counts["folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"] += 1
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return counts


def test_save_json_fsyncs_the_file_and_its_folder(tmp_path, monkeypatch):
    counts = _count_fsyncs(monkeypatch)
    path = bench.save_json({"a": 1}, tmp_path / "r.json")
    assert bench.load_json(path) == {"a": 1}
    assert counts == {"file": 1, "folder": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_concurrent_writers_of_one_path_never_leave_a_partial_file(tmp_path):
    """Eight threads write the same JSON file (each a different 2 MB payload) while a reader reads it: every
    read is one complete payload, no writer fails, and no temporary file is left over."""
    path = tmp_path / "same.json"
    bench.save_json({"writer": -1, "blob": ""}, path)
    payloads = [{"writer": i, "blob": str(i) * 2_000_000} for i in range(8)]
    errors: list[BaseException] = []
    bad_reads: list[str] = []
    done = threading.Event()

    def writer(payload):
        try:
            for _ in range(3):
                bench.save_json(payload, path)
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    def reader():
        while not done.is_set():
            try:
                got = json.loads(path.read_text())
            except (json.JSONDecodeError, FileNotFoundError) as exc:
                bad_reads.append(repr(exc)[:80])
                continue
            if got["writer"] >= 0 and got["blob"] != str(got["writer"]) * 2_000_000:
                bad_reads.append(f"mixed content from writer {got['writer']}")

    threads = [threading.Thread(target=writer, args=(p,)) for p in payloads]
    watcher = threading.Thread(target=reader)
    watcher.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    watcher.join()
    assert not errors, errors
    assert not bad_reads, bad_reads[:3]
    final = bench.load_json(path)
    assert final["blob"] == str(final["writer"]) * 2_000_000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["same.json"]


def test_a_failure_mid_write_keeps_the_old_file_and_no_temporary_file(tmp_path):
    path = tmp_path / "keep.bin"
    path.write_bytes(b"old content")

    def half_then_fail(f):
        f.write(b"new cont")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic.atomic_write(path, half_then_fail)
    assert path.read_bytes() == b"old content"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.bin"]


def test_a_failing_fsync_keeps_the_old_file_and_no_temporary_file(tmp_path, monkeypatch):
    path = tmp_path / "r.json"
    bench.save_json({"v": 1}, path)

    def failing_fsync(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OSError):
        bench.save_json({"v": 2}, path)
    monkeypatch.undo()
    assert bench.load_json(path) == {"v": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_atomic_write_gives_the_usual_permissions(tmp_path):
    path = atomic.atomic_write_text(tmp_path / "p.txt", "x")
    mask = os.umask(0o022)
    os.umask(mask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~mask
