"""dlo.runtime.launch end to end: real processes talking over gloo on this machine's CPU."""
from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import pytest

import dlo  # noqa: F401
from dlo.runtime import LaunchError, free_port, launch
from dlo.runtime.forked import _Tail
from dlo.runtime.launch_report import _blame, _without_own_prefix

SCRIPTS = Path(__file__).parent / "scripts"
distributed = pytest.mark.distributed  # spawns processes: deselect with -m "not distributed"


@pytest.fixture(autouse=True)
def _torchrun_unless_a_test_says_fork(monkeypatch):
    """These tests are about torchrun (launch()'s default): `make test` sets DLO_LAUNCHER=fork for the other tests."""
    monkeypatch.delenv("DLO_LAUNCHER", raising=False)


@distributed
def test_launch_allreduce_two_ranks(tmp_path, capsys):
    records = launch(SCRIPTS / "allreduce.py", nproc=2, records_dir=tmp_path, timeout_s=120, use_srun=False)

    assert [r["rank"] for r in records] == [0, 1]
    assert all(r["world_size"] == 2 and r["sum"] == 3.0 for r in records)  # (0 + 1) + (1 + 1)
    assert {r["backend"] for r in records} == {"gloo"} and {r["source"] for r in records} == {"torchrun"}

    out = capsys.readouterr().out
    for rank in (0, 1):
        assert f"[rank{rank}] hello from rank {rank} of 2 (torchrun): sum=3" in out.splitlines()
        assert f"[rank{rank}] a line on stderr from rank {rank}" in out.splitlines()  # stderr is streamed too
    assert "[default" not in out  # torchrun's own prefix is normalised away
    assert (tmp_path / "launch.log").read_text().count("[rank") >= 4
    assert (tmp_path / "torchrun").is_dir() and not (tmp_path / "rank0.log").exists()  # torchrun, not forked ranks


@distributed
def test_launch_failure_names_the_rank_that_failed_first(tmp_path, capsys):
    start = time.monotonic()
    with pytest.raises(LaunchError) as err:
        launch(SCRIPTS / "fail_rank1.py", nproc=2, records_dir=tmp_path, timeout_s=90, use_srun=False)
    elapsed = time.monotonic() - start
    exc = err.value

    msg = str(exc)
    assert "\n" not in msg
    assert msg.startswith("rank 1 of fail_rank1.py failed with exit code 1: ValueError: boom")
    assert (exc.rank, exc.exit_code, exc.last_line, exc.timed_out) == (1, 1, "ValueError: boom", False)
    assert "[rank1] ValueError: boom" in exc.log.splitlines()  # the full log is kept, one rank prefix per line
    out = capsys.readouterr().out  # the traceback and torchrun's report stay in the log, not on screen
    assert "Traceback" not in out and "[torchrun]" not in out and "[rank1] ValueError: boom" not in out
    assert exc._render_traceback_()[0] == "rank 1 failed: ValueError: boom"  # what a notebook shows
    assert elapsed < 60, f"rank 0 was left waiting for the dead rank 1 ({elapsed:.0f} s)"


@distributed
def test_launch_timeout_stops_the_run(tmp_path):
    with pytest.raises(LaunchError) as err:
        launch(SCRIPTS / "hang.py", nproc=2, records_dir=tmp_path, timeout_s=20, use_srun=False, echo=False)
    exc = err.value
    assert exc.timed_out and "timed out after 20 s" in str(exc) and "\n" not in str(exc)
    assert exc.last_line == "started, now sleeping" and "] started, now sleeping" in str(exc)


@pytest.fixture
def fake_srun(tmp_path):
    """A PATH entry holding an ``srun`` that runs tests/scripts/fake_srun.py (Slurm is not installed here)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    srun = bindir / "srun"
    srun.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{SCRIPTS / "fake_srun.py"}" "$@"\n')
    srun.chmod(0o755)
    return f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"


@distributed
def test_launch_through_srun(tmp_path, capsys, fake_srun):
    """srun form: tasks read SLURM_* variables; init_distributed exports RANK/MASTER_* so env:// works."""
    env = {"PATH": fake_srun, "SLURM_JOB_ID": "4242", "MASTER_PORT": str(free_port())}
    records = launch(SCRIPTS / "allreduce.py", nproc=2, records_dir=tmp_path / "rec", env=env, timeout_s=120)

    assert [(r["rank"], r["sum"], r["source"]) for r in records] == [(0, 3.0, "slurm"), (1, 3.0, "slurm")]
    lines = capsys.readouterr().out.splitlines()
    assert "[rank1] hello from rank 1 of 2 (slurm): sum=3" in lines  # srun's "1: " label normalised


@distributed
def test_launch_through_srun_failure(tmp_path, fake_srun):
    env = {"PATH": fake_srun, "SLURM_JOB_ID": "4242", "MASTER_PORT": str(free_port())}
    with pytest.raises(LaunchError) as err:
        launch(SCRIPTS / "fail_rank1.py", nproc=2, records_dir=tmp_path / "rec", env=env, timeout_s=90, echo=False)
    assert (err.value.rank, err.value.exit_code, err.value.last_line) == (1, 1, "ValueError: boom")
    assert err.value.command[0] == "srun"


def test_launch_in_too_small_slurm_job_says_what_to_do(tmp_path, monkeypatch):
    """A notebook job submitted with --ntasks 1 cannot srun 2 tasks: say so before starting anything."""
    monkeypatch.setenv("SLURM_JOB_ID", "99")
    monkeypatch.setenv("SLURM_NTASKS", "1")
    with pytest.raises(ValueError, match="use_srun=False"):
        launch(SCRIPTS / "allreduce.py", nproc=2, records_dir=tmp_path)


def test_blame_prefers_earliest_exception_then_error_codes():
    torchrun_summary = [
        "Failures:", "[1]:", "  rank      : 0 (local_rank: 0)", "  exitcode  : -15 (pid: 11)  (SIGTERM)",
        "Root Cause (first observed failure):", "[0]:", "  rank      : 1 (local_rank: 1)", "  exitcode  : 1 (pid: 12) ",
    ]
    traceback = ["Traceback (most recent call last):", '  File "x.py", line 3', "    raise ValueError('boom')"]
    per_rank = {0: ["ready"], 1: ["ready", *traceback, "ValueError: boom", ""]}
    assert _blame(torchrun_summary, per_rank, [], False, 1) == (1, 1, "ValueError: boom")
    notes = [{"rank": 0, "time": 2.0, "exception": "RuntimeError: Connection closed by peer"},
             {"rank": 1, "time": 1.5, "exception": "ValueError: boom"}]
    assert _blame(torchrun_summary, per_rank, notes, False, 1) == (1, 1, "ValueError: boom")
    srun_report = ["srun: error: n1: task 0: Killed", "srun: error: n2: task 3: Exited with exit code 2"]
    assert _blame(srun_report, {3: ["bad input", ""]}, [], True, 2) == (3, 2, "bad input")
    assert _blame(["No such file: x.py"], {}, [], False, 1) == (None, 1, "No such file: x.py")


def test_launch_with_srun_missing_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no srun here
    with pytest.raises(RuntimeError, match=re.escape("cannot start 'srun'")):
        launch(SCRIPTS / "allreduce.py", nproc=2, records_dir=tmp_path / "r", use_srun=True)


# --------------------------------------------------------------------------------------------------
# launch_forked: ranks forked from a server that has already imported torch (checkers, tests)
# --------------------------------------------------------------------------------------------------

@distributed
@pytest.mark.parametrize("nproc", [2, 3])
def test_forked_ranks_run_the_script_as_main_with_torch_already_imported(nproc, monkeypatch):
    from dlo.runtime.launch import FORK_PRELOAD, launch_forked

    assert "torch._dynamo" in FORK_PRELOAD  # what every optimizer imports when it is built

    monkeypatch.setenv("RANK", "7")  # the caller's own rank variables must not leak into the ranks
    records = launch_forked(SCRIPTS / "forked_probe.py", ["--flag", "x y"], nproc=nproc, timeout_s=120,
                            env={"DLO_PROBE": "seen", "OMP_NUM_THREADS": "1"})
    assert [r["rank"] for r in records] == list(range(nproc))
    assert {r["sum"] for r in records} == {nproc * (nproc + 1) / 2}
    assert all(r["preloaded"] == sorted(FORK_PRELOAD) and r["threads"] == 1 and r["main"] == "__main__"
               for r in records)
    assert all(r["argv"] == ["--flag", "x y"] and r["probe"] == "seen" for r in records)


@distributed
def test_forked_failure_names_the_rank_that_failed_first():
    from dlo.runtime.launch import launch_forked

    with pytest.raises(LaunchError) as err:
        launch_forked(SCRIPTS / "fail_rank1.py", nproc=2, timeout_s=90)  # rank 0 blocks in an all-reduce
    exc = err.value
    assert "\n" not in str(exc) and str(exc).startswith("rank 1 of fail_rank1.py failed with exit code 1: ValueError: boom")
    assert (exc.rank, exc.exit_code, exc.last_line, exc.timed_out) == (1, 1, "ValueError: boom", False)
    assert "[rank1] ValueError: boom" in exc.log.splitlines()


@distributed
def test_forked_exit_code_and_timeout_are_reported():
    from dlo.runtime.launch import launch_forked

    with pytest.raises(LaunchError) as err:
        launch_forked(SCRIPTS / "forked_probe.py", ["--exit-code", "3"], nproc=2, timeout_s=120)
    assert (err.value.rank, err.value.exit_code) == (1, 3)
    with pytest.raises(LaunchError) as err:
        launch_forked(SCRIPTS / "hang.py", nproc=2, timeout_s=15)
    assert err.value.timed_out and err.value.last_line == "started, now sleeping" and "timed out after 15 s" in str(err.value)
    # stopped with SIGABRT first: each rank's log shows where it was (the sleep, line 5 of hang.py)
    assert err.value.log.count('hang.py", line 5 in <module>') == 2, err.value.log[-1500:]
    assert "where each rank was is in the full log" in str(err.value)


@distributed
def test_dlo_launcher_fork_makes_launch_fork_its_ranks_and_echo_their_lines(tmp_path, capsys, monkeypatch):
    """DLO_LAUNCHER=fork: launch() starts no torchrun (no torchrun log folder, one log per forked rank), returns the
    same records and prints every rank's lines, stdout and stderr, with its prefix."""
    monkeypatch.setenv("DLO_LAUNCHER", "fork")
    records = launch(SCRIPTS / "allreduce.py", nproc=3, records_dir=tmp_path, timeout_s=120, use_srun=False)
    assert [r["rank"] for r in records] == [0, 1, 2] and {r["sum"] for r in records} == {6.0}
    out = capsys.readouterr().out.splitlines()
    for rank in range(3):
        assert f"[rank{rank}] hello from rank {rank} of 3 (torchrun): sum=6" in out
        assert f"[rank{rank}] a line on stderr from rank {rank}" in out
    assert not any(line.startswith("[torchrun]") for line in out)
    assert not (tmp_path / "torchrun").exists() and (tmp_path / "rank2.log").is_file()  # forked: one log per rank
    with pytest.raises(LaunchError) as err:  # failures are reported as launch() reports them
        launch(SCRIPTS / "fail_rank1.py", nproc=2, records_dir=tmp_path / "f", timeout_s=90, use_srun=False)
    assert str(err.value).startswith("rank 1 of fail_rank1.py failed with exit code 1: ValueError: boom")


def test_live_echo_keeps_a_character_split_across_reads_and_one_prefix(tmp_path, capsys):
    """A forked rank's live output is read in chunks: a UTF-8 character cut between two reads is printed whole once
    its last byte arrives; torch.distributed's own "[rank1]: " prefix is not doubled; a last unterminated line is
    printed at the end."""
    log = tmp_path / "rank1.log"
    data = "× moyenne 1 – ok\n[rank1]: Traceback (most recent call last):\nlast words ✓".encode()
    cut = data.index("–".encode()) + 1  # inside the 3 bytes of the en dash
    tail = _Tail(log, 1)
    log.write_bytes(data[:cut])
    tail.emit()
    assert capsys.readouterr().out == ""  # no complete line yet
    with log.open("ab") as f:
        f.write(data[cut:])
    tail.emit()
    assert capsys.readouterr().out.splitlines() == ["[rank1] × moyenne 1 – ok",
                                                    "[rank1] Traceback (most recent call last):"]
    tail.emit(final=True)
    assert capsys.readouterr().out.splitlines() == ["[rank1] last words ✓"]
    assert _without_own_prefix("[rank2]: x", 2) == "x" and _without_own_prefix("[rank2]: x", 3) == "[rank2]: x"


def test_dlo_launcher_unknown_value_is_one_line_before_anything_starts(tmp_path, monkeypatch):
    monkeypatch.setenv("DLO_LAUNCHER", "mpirun")
    with pytest.raises(ValueError, match="^DLO_LAUNCHER='mpirun' is not a launcher: set it to one of torchrun, fork"):
        launch(SCRIPTS / "allreduce.py", nproc=2, records_dir=tmp_path, use_srun=False)
    assert not (tmp_path / "launch.log").exists()


@distributed
def test_dlo_launcher_fork_still_uses_srun_inside_a_slurm_job(tmp_path, fake_srun, monkeypatch):
    monkeypatch.setenv("DLO_LAUNCHER", "fork")
    env = {"PATH": fake_srun, "SLURM_JOB_ID": "4242", "MASTER_PORT": str(free_port())}
    records = launch(SCRIPTS / "allreduce.py", nproc=2, records_dir=tmp_path, env=env, timeout_s=120, echo=False)
    assert {r["source"] for r in records} == {"slurm"}


@pytest.mark.parametrize("nprocs, device, gpus, least, message", [
    (4, "cuda", 2, 1, "launches 4 processes but only 2 GPU\\(s\\) are visible: NCCL needs one GPU per process"),
    ([2, 4, 8], "cuda:0", 4, 2, "launches 8 processes but only 4 GPU"),
    (4, "cuda", 1, 1, "only 1 GPU"),
    (1, "cuda", 8, 2, "needs at least 2 process\\(es\\) per run, got 1"),
    ([2, 0], "cpu", None, 1, "needs at least 1 process"),
    ([], "cpu", None, 1, "needs at least 1 process"),
    (True, "cpu", None, 1, "got True"),
    (2.0, "cpu", None, 1, "got 2.0"),
])
def test_check_processes_refuses_in_one_line(nprocs, device, gpus, least, message):
    from dlo.runtime import check_processes

    with pytest.raises(ValueError, match=message) as info:
        check_processes(nprocs, device, least=least, what="the lesson", gpus=gpus)
    assert "\n" not in str(info.value)


def test_check_processes_allows_one_gpu_each_and_any_count_on_a_cpu():
    import torch

    from dlo.runtime import check_processes

    assert check_processes(4, "cuda", gpus=4) == [4]
    assert check_processes([2, 4, 8], torch.device("cuda", 0), least=2, gpus=8) == [2, 4, 8]
    assert check_processes([8], torch.device("cpu"), least=2) == [8]  # gloo processes share the cores
    assert check_processes((2, 3), "cpu", least=2) == [2, 3]


# --------------------------------------------------------------------------------------------------
# The rank that failed first is blamed, whatever the script's pattern and however the rank died
# --------------------------------------------------------------------------------------------------

_PEER = "RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:4242"


def test_blame_treats_a_lost_peer_as_a_consequence_even_when_noted_first():
    """Rank 0's "Connection closed by peer" is what it says once rank 1 is gone, even when its note is earlier; a
    rank killed by a signal or leaving through os._exit has no note: its exit code is the evidence, SIGTERM
    from torchrun (stopping the others) is not."""
    summary = ["Failures:", "[1]:", "  rank      : 0 (local_rank: 0)", "  exitcode  : 1 (pid: 11)",
               "Root Cause (first observed failure):", "[0]:", "  rank      : 1 (local_rank: 1)",
               "  exitcode  : 1 (pid: 12)"]
    per_rank = {0: ["ready", _PEER], 1: ["ready", "ValueError: boom"]}
    notes = [{"rank": 0, "time": 1.0, "exception": _PEER}, {"rank": 1, "time": 2.0, "exception": "ValueError: boom"}]
    assert _blame(summary, per_rank, notes, False, 1) == (1, 1, "ValueError: boom")

    killed = [line.replace("exitcode  : 1 (pid: 12)", "exitcode  : -9 (pid: 12)") for line in summary]
    per_rank = {0: ["ready", _PEER], 1: ["ready", "rank 1 fails now (kill)"]}
    assert _blame(killed, per_rank, notes[:1], False, 1) == (1, -9, "rank 1 fails now (kill)")
    exited = [line.replace("exitcode  : 1 (pid: 12)", "exitcode  : 3 (pid: 12)") for line in summary]
    assert _blame(exited, per_rank, notes[:1], False, 1) == (1, 3, "rank 1 fails now (kill)")
    # rank 2 stopped by torchrun (SIGTERM) after rank 1 was killed: rank 1 is still the one
    three = killed + ["[2]:", "  rank      : 2 (local_rank: 2)", "  exitcode  : -15 (pid: 13)"]
    assert _blame(three, {**per_rank, 2: ["ready"]}, notes[:1], False, 1)[0] == 1
    # only consequences: the earliest of them
    assert _blame(summary, per_rank, [notes[0], {**notes[0], "rank": 1, "time": 3.0}], False, 1)[0] == 0


def test_forked_blame_weighs_exit_times_and_ranks_it_stopped_itself():
    from dlo.runtime.launch_report import _first_failure

    lines = {0: ["ready", _PEER], 1: ["fails now"], 2: ["ready"]}
    codes = {0: 1, 1: -9, 2: -9}
    # rank 2 was killed by the launcher (stopped), rank 1 by someone else: rank 1, whatever the notes say
    assert _first_failure(codes, {2}, [{"rank": 0, "time": 1.0, "exception": _PEER}], lines, {0: 1.1, 1: 1.2}) == \
        (1, "fails now")
    # a rank seen exiting before another rank's note failed first, even if that note is not a lost peer
    notes = [{"rank": 0, "time": 5.0, "exception": "ValueError: wrapped"}]
    assert _first_failure({0: 1, 1: 3}, set(), notes, lines, {1: 4.0, 0: 5.1}) == (1, "fails now")
    assert _first_failure({0: 1, 1: 3}, set(), notes, lines, {1: 5.5, 0: 5.1}) == (0, "ValueError: wrapped")
    assert _first_failure({0: 0, 1: 0}, set(), [], lines) is None
    assert _first_failure({0: -9, 1: -9}, {0, 1}, [], lines) == (0, _PEER)


def test_distributed_block_notes_the_failure_before_destroying_the_group(tmp_path, monkeypatch):
    """`with distributed():` writes the failing rank's note before its exit destroys the process group (which
    makes the peers fail at once); the excepthook seeing the same exception later keeps that first note."""
    import importlib
    import json
    import sys

    from dlo.runtime import records

    distributed_module = importlib.import_module("dlo.runtime.distributed")  # dlo.runtime.distributed: the function

    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # init_distributed installs the hook: undone after
    monkeypatch.setenv(records.RECORDS_ENV, str(tmp_path))
    note = tmp_path / "failures" / "rank0.json"
    seen_at_teardown = []
    monkeypatch.setattr(distributed_module, "teardown", lambda: seen_at_teardown.append(note.exists()))
    with pytest.raises(ValueError, match="boom"):
        with distributed_module.distributed(device="cpu"):
            raise ValueError("boom")
    assert seen_at_teardown == [True]
    first = json.loads(note.read_text())
    assert first["exception"] == "ValueError: boom"
    records.note_failure(RuntimeError("later, at the top of the script"))
    assert json.loads(note.read_text()) == first
    monkeypatch.setenv(records.RECORDS_ENV, str(tmp_path / "other"))
    with pytest.raises(SystemExit):  # sys.exit(n) is said by the exit code: no note
        with distributed_module.distributed(device="cpu"):
            raise SystemExit(2)
    assert not (tmp_path / "other" / "failures").exists()


# Every way a rank can fail first, in both patterns: the launcher must name it with its own last line.
_FAILURES = [("raise", "context"), ("kill", "context"), ("exit", "context"),
             ("raise", "bare"), ("kill", "bare"), ("exit", "bare")]
_EXPECTED = {"raise": (1, "ValueError: boom"), "kill": (-9, "rank 1 fails now (kill)"),
             "exit": (3, "rank 1 fails now (exit)")}


def _check_blamed_first(launcher, nproc, runs, tmp_path, monkeypatch):
    if launcher == "fork":
        monkeypatch.setenv("DLO_LAUNCHER", "fork")
    wrong = []
    for i, (how, pattern) in enumerate(runs):
        with pytest.raises(LaunchError) as err:
            launch(SCRIPTS / "fail_first.py", ["--how", how, "--pattern", pattern], nproc=nproc,
                   records_dir=tmp_path / f"run{i}", timeout_s=150, use_srun=False, echo=False)
        exc = err.value
        code, last = _EXPECTED[how]
        # torchrun stops the other ranks (SIGTERM) once one has exited: a rank that raised may be stopped
        # while it is still shutting down, after its failure was noted
        codes = (code, -15) if how == "raise" and launcher == "torchrun" else (code,)
        if exc.rank != 1 or exc.exit_code not in codes or exc.last_line != last or "\n" in str(exc):
            wrong.append(f"{how}/{pattern}: {exc}")
    assert not wrong, f"{len(wrong)} of {len(runs)} runs blamed the wrong rank or line: {wrong}"


@distributed
@pytest.mark.parametrize("nproc", [2, 3])
def test_forked_launch_blames_the_rank_that_failed_first(nproc, tmp_path, monkeypatch):
    _check_blamed_first("fork", nproc, _FAILURES + [("raise", "context")] * 2, tmp_path, monkeypatch)


@distributed
def test_torchrun_launch_blames_the_rank_that_failed_first(tmp_path, monkeypatch):
    """torchrun on 3 ranks (a bystander besides the failing rank 1 and rank 0): every rank of every run imports torch
    (about 25 s a world size on 2 cores), so one world size here. The fork launcher above tries 2 and 3, torchrun on 2
    ranks is test_launch_failure_names_the_rank_that_failed_first, and how torchrun's output is read (``_blame``) is
    tested on written outputs by the blame tests above."""
    runs = [("raise", "context")] * 3 + [("kill", "context"), ("exit", "bare")]
    _check_blamed_first("torchrun", 3, runs, tmp_path, monkeypatch)
