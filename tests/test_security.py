"""What dlo refuses to trust and how it writes: files from disk never run code when loaded (data batches,
checkpoints, pretrained weights), results are written atomically, a local process group listens only on
the loopback interface."""
from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

import dlo  # noqa: F401  (before torchvision: prepares its import)
from dlo.measure import bench
from dlo.runtime import atomic
from dlo.measure import save_json, load_json


# --------------------------------------------------------------------------------------------------
# Crafted pickles: loading one must not run its code
# --------------------------------------------------------------------------------------------------

class _WritesMarker:
    """Unpickling this object creates the file ``marker`` (calls ``open(marker, "w")``): what a crafted file would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


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
    path = save_json({"a": 1}, tmp_path / "r.json")
    assert load_json(path) == {"a": 1}
    assert counts == {"file": 1, "folder": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_concurrent_writers_of_one_path_never_leave_a_partial_file(tmp_path):
    """Eight threads write the same JSON file (each a different 2 MB payload) while a reader reads it: every
    read is one complete payload, no writer fails, and no temporary file is left over."""
    path = tmp_path / "same.json"
    save_json({"writer": -1, "blob": ""}, path)
    payloads = [{"writer": i, "blob": str(i) * 2_000_000} for i in range(8)]
    errors: list[BaseException] = []
    bad_reads: list[str] = []
    done = threading.Event()

    def writer(payload):
        try:
            for _ in range(3):
                save_json(payload, path)
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
    final = load_json(path)
    assert final["blob"] == str(final["writer"]) * 2_000_000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["same.json"]


def test_a_failure_mid_write_keeps_the_old_file_and_no_temporary_file(tmp_path):
    path = tmp_path / "keep.bin"
    path.write_bytes(b"old content")

    def half_then_fail(tmp):
        with open(tmp, "wb") as f:
            f.write(b"new cont")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic.atomic_write(path, half_then_fail)
    assert path.read_bytes() == b"old content"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.bin"]


def test_a_failing_fsync_keeps_the_old_file_and_no_temporary_file(tmp_path, monkeypatch):
    path = tmp_path / "r.json"
    save_json({"v": 1}, path)

    def failing_fsync(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OSError):
        save_json({"v": 2}, path)
    monkeypatch.undo()
    assert load_json(path) == {"v": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_atomic_write_gives_the_usual_permissions(tmp_path):
    path = atomic.atomic_write_text(tmp_path / "p.txt", "x")
    mask = os.umask(0o022)
    os.umask(mask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~mask


# --------------------------------------------------------------------------------------------------
# Data batches: generated folders list their own md5 sums, so the md5 check cannot be what protects
# --------------------------------------------------------------------------------------------------

def _one_line(exc_info) -> str:
    msg = str(exc_info.value)
    assert msg and "\n" not in msg, f"error message should be one line: {msg!r}"
    return msg


@pytest.fixture()
def no_data_env(tmp_path, monkeypatch):
    from dlo.runtime import paths

    monkeypatch.delenv("DLO_DATA_DIR", raising=False)
    monkeypatch.delenv("DSDIR", raising=False)
    monkeypatch.setattr(paths, "CACHE_DIR", tmp_path / "cache")
    monkeypatch.setattr(paths, "ROOT", tmp_path / "project")


def _plant(folder: Path, name: str, marker: Path) -> None:
    (folder / name).write_bytes(_crafted_bytes(marker))


@pytest.mark.parametrize("name", ["data_batch_1", "batches.meta"])
def test_crafted_batch_in_a_generated_folder_runs_no_code(tmp_path, monkeypatch, no_data_env, name):
    """A folder with GENERATED.json supplies its own md5 sums: whoever plants a file can update them too."""
    from dlo import data
    from dlo.data.format import _md5

    root = data.make_generated_cifar10(tmp_path / "gen", n_train=10, n_test=10, seed=0)
    folder = root / data.BASE_FOLDER
    marker = tmp_path / "code-ran"
    _plant(folder, name, marker)
    meta = json.loads((folder / data.MARKER_NAME).read_text())
    meta["md5"][name] = _md5(folder / name)
    (folder / data.MARKER_NAME).write_text(json.dumps(meta))
    monkeypatch.setenv("DLO_DATA_DIR", str(root))
    with pytest.raises(ValueError) as exc:
        data.cifar10("train", verbose=False)
    assert not marker.exists(), "loading a data file ran code from it"
    msg = _one_line(exc)
    assert str(folder / name) in msg and "io.open" in msg


@pytest.mark.parametrize("name", ["data_batch_1", "batches.meta"])
def test_crafted_batch_in_a_real_looking_folder_runs_no_code(tmp_path, monkeypatch, no_data_env, name):
    """Even if a crafted file passed the md5 check of real CIFAR-10 (md5 has known collisions), nothing runs."""
    import shutil

    import torchvision.datasets.cifar as tv_cifar

    from dlo import data

    gen = data.make_generated_cifar10(tmp_path / "gen", n_train=10, n_test=10, seed=0)
    root = tmp_path / "real"
    shutil.copytree(gen / data.BASE_FOLDER, root / data.BASE_FOLDER)
    (root / data.BASE_FOLDER / data.MARKER_NAME).unlink()
    marker = tmp_path / "code-ran"
    _plant(root / data.BASE_FOLDER, name, marker)
    monkeypatch.setattr(tv_cifar, "check_integrity", lambda fpath, md5=None: os.path.isfile(fpath))
    with pytest.raises(ValueError) as exc:
        data.cifar10("train", data_dir=root, generated=False, verbose=False)
    assert not marker.exists(), "loading a data file ran code from it"
    msg = _one_line(exc)
    assert str(root / data.BASE_FOLDER / name) in msg and "io.open" in msg


def _not_pickles() -> list[bytes]:
    """Bytes that are not a CIFAR pickle: seeded random files (the same every run), and the headers that
    random bytes hit now and then: a pickle protocol byte followed by an 8-byte or 4-byte length far larger
    than the file (BINBYTES8 once raised OverflowError, BINUNICODE8 may ask for gigabytes), a deep nest."""
    rng = np.random.default_rng(0)
    files = [rng.integers(0, 256, size=int(n), dtype=np.uint8).tobytes() for n in rng.integers(1, 5000, 300)]
    files += [b"\x80\x05\x8e" + b"\xff" * 8 + b"xx",        # BINBYTES8, length 2**64 - 1
              b"\x80\x05\x8d" + b"\x00\x00\x00\xf0" * 2,  # BINUNICODE8, length ~ 2**63
              b"\x80\x04B" + b"\xff\xff\xff\x7f" + b"ab",   # BINBYTES, length 2 GiB
              b"\x80\x02" + b"]" * 100_000,                  # 100,000 nested empty lists, never closed
              b""]
    return files


def test_a_batch_file_of_random_bytes_is_one_line(tmp_path):
    from dlo.data.format import load_batch

    path = tmp_path / "data_batch_1"
    for i, raw in enumerate(_not_pickles()):
        path.write_bytes(raw)
        with pytest.raises(ValueError) as exc:
            load_batch(path)
        assert str(path) in _one_line(exc), f"file {i} ({raw[:12]!r}...)"


# --------------------------------------------------------------------------------------------------
# Checkpoints and pretrained weights load with weights_only=True
# --------------------------------------------------------------------------------------------------

def _crafted_checkpoints(tmp_path: Path, marker: Path) -> list[Path]:
    """A torch.save zip file and a bare pickle, each running ``open(marker, "w")`` when fully unpickled."""
    zipped = tmp_path / "crafted-zip.pt"
    torch.save({"model": _WritesMarker(marker), "step": 1}, zipped)
    bare = tmp_path / "crafted-pickle.pt"
    bare.write_bytes(_crafted_bytes(marker))
    return [zipped, bare]


def test_crafted_checkpoint_is_refused_without_running_it(tmp_path):
    from dlo.models import resnet18_cifar
    from dlo.training.checkpoint import load_checkpoint

    marker = tmp_path / "code-ran"
    for path in _crafted_checkpoints(tmp_path, marker):
        with pytest.raises(ValueError) as exc:
            load_checkpoint(path, model=resnet18_cifar(width=4))
        assert not marker.exists(), f"loading {path.name} ran code from it"
        assert str(path) in _one_line(exc)
    assert "io.open" in str(exc.value) or "not a checkpoint" in str(exc.value)


def test_crafted_pretrained_weights_are_refused_without_running_them(tmp_path):
    from dlo.models import resnets

    marker = tmp_path / "code-ran"
    for path in _crafted_checkpoints(tmp_path, marker):
        with pytest.raises(Exception) as exc:
            resnets.load_pretrained(resnets.resnet18_cifar(width=4), path)
        assert not marker.exists(), f"loading {path.name} ran code from it"
        assert str(path) in _one_line(exc)


def test_failure_note_of_a_rank_is_written_atomically(tmp_path, monkeypatch):
    """The note a crashing rank leaves for the launcher goes through the atomic writer (fsync of file and folder)."""
    import sys

    from dlo.runtime import records

    monkeypatch.setenv(records.RECORDS_ENV, str(tmp_path))
    seen = []
    monkeypatch.setattr(sys, "excepthook", lambda *exc: seen.append(exc[0]))
    records._install_failure_hook()
    counts = _count_fsyncs(monkeypatch)
    sys.excepthook(ValueError, ValueError("boom"), None)
    note = json.loads((tmp_path / "failures" / "rank0.json").read_text())
    assert note["exception"] == "ValueError: boom" and seen == [ValueError]
    assert counts == {"file": 1, "folder": 1}
    assert sorted(p.name for p in (tmp_path / "failures").iterdir()) == ["rank0.json"]


# --------------------------------------------------------------------------------------------------
# A group of one listens on no network
# --------------------------------------------------------------------------------------------------

def test_group_of_one_listens_only_on_loopback():
    """init_distributed(group_of_one=True) makes a group nobody else joins: every socket it listens on is
    bound to 127.0.0.1 (or ::1), none to all interfaces or to the machine's network address."""
    import subprocess
    import sys

    code = (
        "import dlo, os, psutil, torch, torch.distributed as dist\n"
        "from dlo.runtime import init_distributed, teardown\n"
        "init_distributed(group_of_one=True, device='cpu')\n"
        "dist.all_reduce(torch.ones(1))\n"  # the group works
        "listening = sorted({c.laddr.ip for c in psutil.Process().net_connections(kind='tcp')\n"
        "                   if c.status == psutil.CONN_LISTEN})\n"
        "print(' '.join(listening) or 'none')\n"
        "print(os.environ.get('GLOO_SOCKET_IFNAME'))\n"
        "teardown()\n"
    )
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_JOB_ID", "SLURM_PROCID", "SLURM_NTASKS", "MASTER_ADDR",
            "MASTER_PORT", "GLOO_SOCKET_IFNAME", "DLO_DEVICE")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    listening, ifname = out.stdout.split("\n")[:2]
    assert set(listening.split()) <= {"127.0.0.1", "::1", "none"}, listening
    assert ifname.startswith("lo"), ifname  # gloo was told to use the loopback interface


# --------------------------------------------------------------------------------------------------
# Sharded (torch.distributed.checkpoint) checkpoints: torch's own reader unpickles the folder's .metadata
# --------------------------------------------------------------------------------------------------

class _RunsCommand:
    """Unpickling this object runs ``os.system(command)``: what a crafted ``.metadata`` would do."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def test_crafted_sharded_metadata_is_refused_without_running_it(tmp_path):
    """A folder whose .metadata pickle would run a shell command: refused in one line naming the file, by the
    check load_sharded makes first and by the reader it hands to dcp.load; the command never runs."""
    import pickle

    from dlo.parallel import fsdp

    marker = tmp_path / "code-ran"
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / ".metadata").write_bytes(pickle.dumps(_RunsCommand(f"touch {marker}")))
    (folder / "__0_0.distcp").write_bytes(b"")
    for read in (lambda: fsdp.read_sharded_metadata(folder),
                 lambda: fsdp._safe_dcp_reader(folder).read_metadata(),
                 lambda: fsdp.load_sharded(folder, model=None, optimizer=None)):  # refused before the model is used
        with pytest.raises(fsdp.UnsafeCheckpoint) as exc:
            read()
        assert not marker.exists(), "reading the checkpoint's metadata ran its code"
        msg = _one_line(exc)
        assert str(folder / ".metadata") in msg and "system" in msg
    (folder / ".metadata").write_bytes(pickle.dumps({"not": "metadata"}))
    with pytest.raises(fsdp.UnsafeCheckpoint, match="holds a dict, not a Metadata"):
        fsdp.read_sharded_metadata(folder)
    (folder / ".metadata").write_bytes(os.urandom(64))
    with pytest.raises(fsdp.UnsafeCheckpoint) as exc:
        fsdp.read_sharded_metadata(folder)
    assert str(folder / ".metadata") in _one_line(exc)
    with pytest.raises(FileNotFoundError, match="save one"):
        fsdp.load_sharded(tmp_path / "nothing", model=None, optimizer=None)


@pytest.fixture(scope="module")
def crafted_sharded(tmp_path_factory):
    """tests/scripts/dcp_crafted.py in a group of one: a real save and load, then three crafted folders."""
    import subprocess
    import sys

    out = tmp_path_factory.mktemp("dcp_crafted")
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_JOB_ID", "SLURM_PROCID", "SLURM_NTASKS", "MASTER_ADDR",
            "MASTER_PORT", "DLO_DEVICE")
    env = {k: v for k, v in os.environ.items() if k not in drop} | {"OMP_NUM_THREADS": "1"}
    script = Path(__file__).parent / "scripts" / "dcp_crafted.py"
    run = subprocess.run([sys.executable, str(script), str(out)], env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads((out / "result.json").read_text()), out


def test_sharded_checkpoint_round_trip_in_one_process(crafted_sharded):
    result, _ = crafted_sharded
    trip = result["round_trip"]
    assert trip["step"] == 2 and trip["params_equal"]
    # the optimizer's plain values came back through the weights_only reader, its state too
    assert trip["lr"] == 3e-3 and trip["betas"] == [0.9, 0.999] and trip["adam_steps"] == [2.0]


@pytest.mark.parametrize("case, words", [
    ("metadata", ["crafted/.metadata", "io.open"]),  # the .metadata pickle itself
    ("outside", ["outside/.metadata", "points outside its folder", "../real/"]),  # a shard path leaving the folder
    ("values", ["values", "optim.param_groups.0.lr", "not plain data"]),  # valid metadata, a value that runs code
])
def test_crafted_sharded_checkpoint_runs_no_code(crafted_sharded, case, words):
    result, out = crafted_sharded
    rec = result[case]
    assert rec["marker"] is False and not (out / f"marker-{case}").exists(), f"loading {case} ran its code"
    assert rec["error"] == "UnsafeCheckpoint", rec
    assert "\n" not in rec["message"] and all(w in rec["message"] for w in words), rec["message"]
