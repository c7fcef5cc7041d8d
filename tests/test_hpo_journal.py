"""The course's Optuna journal (dlo.lessons.hpo.journal_storage) survives a record cut in the middle (a worker killed
while writing) and a full disk; every failure it reports is one line naming the journal file."""
from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import mount_tmpfs as _mount_tmpfs

import dlo  # noqa: F401
from dlo.lessons import hpo
from dlo.lessons.hpo import journal as journal_module

optuna = pytest.importorskip("optuna")
optuna.logging.set_verbosity(optuna.logging.WARNING)


def _objective(trial):
    return trial.suggest_float("x", -1.0, 1.0) ** 2


def _study_with_trials(path: Path, n: int = 3):
    study = optuna.create_study(study_name="s", storage=hpo.journal_storage(path))
    study.optimize(_objective, n_trials=n)
    return study


def _cut_last_record(path: Path) -> bytes:
    """Cut the journal in the middle of its last record, as a worker killed while writing leaves it."""
    data = path.read_bytes()
    start = data.rstrip(b"\n").rfind(b"\n") + 1
    cut = data[: start + (len(data) - start) // 2]
    path.write_bytes(cut)
    return cut


def _trials(path: Path) -> int:
    return len(optuna.load_study(study_name="s", storage=hpo.journal_storage(path)).trials)


def test_a_record_cut_mid_line_is_dropped_before_the_next_append(tmp_path):
    """Optuna appends after whatever the file ends with: after a cut record, "Expecting ',' delimiter" for every worker
    and every load_study, for ever. The course's journal removes the cut record (under the lock) before appending."""
    path = tmp_path / "journal.log"
    _study_with_trials(path, 3)
    kept = _cut_last_record(path)
    before = _trials(path)  # the cut record is not read
    study = optuna.load_study(study_name="s", storage=hpo.journal_storage(path))
    study.optimize(_objective, n_trials=2)  # the next worker appends
    data = path.read_bytes()
    assert data.startswith(kept[: kept.rfind(b"\n") + 1]) and data.endswith(b"\n")
    assert _trials(path) == before + 2
    assert all(line.startswith(b'{"op_code"') for line in data.splitlines())


def test_a_journal_already_spoilt_by_an_append_after_a_cut_is_read_again(tmp_path):
    """A journal spoilt by a plain Optuna writer (a record cut, then a whole one appended on the same line: what Optuna
    leaves) is read: the whole record at the end of that line is kept, the cut one dropped."""
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    path = tmp_path / "journal.log"
    _study_with_trials(path, 2)
    data = path.read_bytes()
    start = data.rstrip(b"\n").rfind(b"\n") + 1
    last = data[start:]
    path.write_bytes(data[:start] + last[: len(last) // 2] + last + last)  # cut, then two whole records appended
    with pytest.raises(ValueError, match="Expecting"):  # Optuna cannot read it back
        optuna.load_study(study_name="s", storage=JournalStorage(JournalFileBackend(str(path))))
    study = optuna.load_study(study_name="s", storage=hpo.journal_storage(path))
    assert len(study.trials) == 2 and all(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
    study.optimize(_objective, n_trials=1)
    assert _trials(path) == 3


def test_an_unreadable_record_is_one_line_naming_the_file_and_line(tmp_path, capsys):
    path = tmp_path / "journal.log"
    _study_with_trials(path, 1)
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join([lines[0], b"{not a record}\n", *lines[1:]]))
    with pytest.raises(ValueError) as err:
        optuna.load_study(study_name="s", storage=hpo.journal_storage(path))
    message = str(err.value)
    assert "\n" not in message and str(path) in message and "line 2" in message
    code = hpo.main(["worker", "--journal", str(path), "--study", "s", "--n-trials", "1"])
    out = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(out) == 1 and str(path) in out[0] and "line 2" in out[0]


@pytest.mark.parametrize("record, named", [
    (b'[1, 2]', "a JSON list, not a record"),
    (b'{"op_code": 99, "worker_id": "w"}', "op_code 99 is not an Optuna journal operation"),
    (b'{"op_code": "4", "worker_id": "w"}', "op_code '4' is not an Optuna journal operation"),
    (b'{"op_code": 4, "worker_id": 7}', "worker_id 7 is not a text"),
    (b'{"op_code": 5, "worker_id": "w"}', "a record of the wrong shape"),
    (b'{"op_code": 0, "worker_id": "w"}', "a record of the wrong shape"),
])
def test_a_valid_json_record_of_the_wrong_shape_is_one_line_naming_the_file(tmp_path, record, named):
    """JSON that parses but is not an Optuna record of the right shape: one JournalCorrupt line naming the file
    (and the line), not Optuna's TypeError / KeyError / 'Should not reach' from inside its replay."""
    path = tmp_path / "journal.log"
    _study_with_trials(path, 1)
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join([*lines, record + b"\n"]))
    with pytest.raises(journal_module.JournalCorrupt) as err:
        optuna.load_study(study_name="s", storage=hpo.journal_storage(path))
    message = str(err.value)
    assert "\n" not in message and str(path) in message and named in message, message
    assert f"line {len(lines) + 1}" in message


def _enospc_after(nbytes: int):
    """A writer that writes ``nbytes`` bytes of what it is given (part of a record), then finds the disk full."""
    budget = [nbytes]

    def write(fd, data):
        if budget[0] <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = os.write(fd, bytes(data[: budget[0]]))
        budget[0] -= n
        return n

    return write


def test_a_full_disk_is_one_line_naming_the_file_and_the_study_reads_again(tmp_path, monkeypatch, capsys):
    path = tmp_path / "journal.log"
    _study_with_trials(path, 2)
    size = path.stat().st_size
    monkeypatch.setattr(journal_module, "_write", _enospc_after(7))  # part of the next record, then a full disk
    code = hpo.main(["worker", "--journal", str(path), "--study", "s", "--n-trials", "3"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert str(path) in err[0] and "no space left" in err[0].lower()
    assert path.stat().st_size == size  # the part written is taken back
    monkeypatch.undo()  # space freed
    assert _trials(path) == 2
    assert hpo.main(["worker", "--journal", str(path), "--study", "s", "--n-trials", "2"]) == 0
    assert _trials(path) == 4


def test_a_real_full_disk_kills_the_worker_in_one_line_and_the_study_reads_after_space_is_freed():
    """On a tmpfs of 64 KiB (needs root): a worker fills it, dies with one line naming the journal and the full disk;
    once space is freed the study is read and continued."""
    folder = Path(tempfile.mkdtemp(prefix="dlo-full-disk-"))
    if not _mount_tmpfs(folder, "64k"):
        folder.rmdir()
        pytest.skip("mounting a small tmpfs needs root")
    try:
        path = folder / "journal.log"
        _study_with_trials(path, 1)
        filler = folder / "filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
        try:  # fill the disk, then leave a few bytes free: the next record is cut
            while os.write(fd, b"x" * 512):
                pass
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
        os.ftruncate(fd, max(0, os.fstat(fd).st_size - 100))
        os.close(fd)
        res = subprocess.run([sys.executable, "-m", "dlo", "hpo", "worker", "--journal", str(path), "--study", "s",
                              "--n-trials", "50"], capture_output=True, text=True, timeout=300)
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 2 and len(lines) == 1, res.stderr[-2000:]
        assert str(path) in lines[0] and "no space left" in lines[0].lower()
        done = _trials(path)
        filler.unlink()  # space freed
        assert _trials(path) == done
        assert hpo.main(["worker", "--journal", str(path), "--study", "s", "--n-trials", "2"]) == 0
        assert _trials(path) == done + 2
    finally:
        if subprocess.run(["umount", str(folder)], capture_output=True, timeout=60).returncode:
            subprocess.run(["umount", "-l", str(folder)], capture_output=True, timeout=60)  # a file still open
        shutil.rmtree(folder, ignore_errors=True)
