"""The launchers' promises that no result shows: nothing listens beyond loopback, a failed rank's peers are
stopped, a note left by an earlier run is not blamed, the caller's rank variables stay the caller's."""
from __future__ import annotations

import json
import multiprocessing
import multiprocessing.forkserver
import os
from pathlib import Path

import psutil
import pytest

import dlo  # noqa: F401
from dlo.runtime import LaunchError, launch, read_records
from dlo.runtime import forked as forked_module
from dlo.runtime.launch import FORK_PRELOAD, launch_forked

SCRIPTS = Path(__file__).parent / "scripts"
distributed = pytest.mark.distributed
LOOPBACK = {"127.0.0.1", "::1"}


@distributed
@pytest.mark.parametrize("launcher", ["fork", "torchrun"])
def test_a_local_run_listens_on_loopback_only(launcher, tmp_path, monkeypatch):
    """Every socket listening in a 2-rank run (the store where the ranks meet -- the fork launcher's, or
    torchrun's agent's two -- and gloo's in each rank) is bound to 127.0.0.1: PyTorch alone binds its stores to
    every interface (":::PORT"), unauthenticated."""
    monkeypatch.setenv("DLO_LAUNCHER", launcher)
    monkeypatch.setenv("DLO_TEST_LAUNCHER_PID", str(os.getpid()))
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    [record] = launch(SCRIPTS / "listening.py", nproc=2, records_dir=tmp_path, timeout_s=120, use_srun=False,
                      echo=False)
    assert record["sum"] == 2.0
    addresses = [ip for ip, _, _ in record["listening"]]
    assert len(addresses) >= 3, record  # a store, and at least one gloo socket per rank
    assert set(addresses) <= LOOPBACK, f"listening beyond loopback: {record['listening']}"


@distributed
def test_the_peers_of_a_failed_rank_are_stopped(tmp_path, monkeypatch):
    """Rank 1 fails at once while rank 0 would run for a minute: the fork launcher stops rank 0 after its grace
    period (no "finished" record, its process gone) and blames rank 1 -- it does not wait for the timeout."""
    monkeypatch.setattr(forked_module, "FORKED_GRACE_S", 0.3)
    with pytest.raises(LaunchError) as err:
        launch_forked(SCRIPTS / "fail_and_linger.py", nproc=2, records_dir=tmp_path, timeout_s=40,
                      env={"OMP_NUM_THREADS": "1"})
    exc = err.value
    assert (exc.rank, exc.exit_code, exc.timed_out) == (1, 1, False), str(exc)
    assert exc.last_line == "ValueError: rank 1 fails at once"
    records = read_records(tmp_path)
    stages = sorted((r["rank"], r["stage"]) for r in records)
    assert stages == [(0, "started"), (1, "started")], stages  # rank 0 never finished: it was stopped
    rank0 = next(r["pid"] for r in records if r["rank"] == 0)
    assert not psutil.pid_exists(rank0) or psutil.Process(rank0).status() == psutil.STATUS_ZOMBIE


@distributed
def test_a_failure_note_left_by_an_earlier_run_is_not_blamed(tmp_path, monkeypatch):
    """An earlier run in the same folder left failure notes (exceptions of their own, long ago) for rank 0 and for
    a rank this run does not have: this run's rank 1 failed first (rank 0 is stopped and writes none), and is
    the one named."""
    monkeypatch.setattr(forked_module, "FORKED_GRACE_S", 0.3)
    notes = tmp_path / "failures"
    notes.mkdir()
    for rank in (0, 5):
        note = {"rank": rank, "time": 1.0 + rank, "exception": "OldError: earlier run"}
        (notes / f"rank{rank}.json").write_text(json.dumps(note))
    with pytest.raises(LaunchError) as err:
        launch_forked(SCRIPTS / "fail_and_linger.py", nproc=2, records_dir=tmp_path, timeout_s=40,
                      env={"OMP_NUM_THREADS": "1"})
    assert (err.value.rank, err.value.last_line) == (1, "ValueError: rank 1 fails at once"), str(err.value)


@distributed
def test_the_callers_rank_variables_neither_reach_the_ranks_nor_change(tmp_path, monkeypatch):
    """A notebook that is itself a rank (or was one) launches 3 ranks: each sees its own numbers, nothing of the
    caller's (``TORCHELASTIC_RUN_ID``), nothing the caller removed since the fork server started (``HOME``),
    and the caller's environment is the same afterwards."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(FORK_PRELOAD))
    multiprocessing.forkserver.ensure_running()  # started with HOME set (if it was not running already)
    caller = {"RANK": "5", "LOCAL_RANK": "3", "WORLD_SIZE": "9", "LOCAL_WORLD_SIZE": "9", "GROUP_RANK": "2",
              "TORCHELASTIC_RUN_ID": "caller"}
    for name, value in caller.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("HOME", raising=False)
    before = dict(os.environ)
    records = launch_forked(SCRIPTS / "rank_env.py", nproc=3, records_dir=tmp_path, timeout_s=60,
                            env={"OMP_NUM_THREADS": "1"})
    assert dict(os.environ) == before
    seen = {r["rank"]: r["env"] for r in records}
    assert seen == {rank: {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "3", "LOCAL_WORLD_SIZE": "3",
                           "GROUP_RANK": "0", "TORCHELASTIC_RUN_ID": None, "HOME": None} for rank in range(3)}


def test_gloo_and_nccl_are_told_the_loopback_interface_on_one_machine_only(tmp_path, monkeypatch):
    """Where the machine's host name resolves to a network address, gloo and NCCL would listen there: local runs
    name the loopback interface (a value set by hand is kept), a run under srun (several nodes) names none."""
    from dlo.runtime.forked import _rank_env
    from dlo.runtime.launch import _launcher_env
    from dlo.runtime.loopback import loopback_interface

    for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        monkeypatch.delenv(name, raising=False)
    lo = loopback_interface()
    forked = _rank_env({"NCCL_SOCKET_IFNAME": "ib0"}, tmp_path, 2, 12345)
    assert (forked["GLOO_SOCKET_IFNAME"], forked["NCCL_SOCKET_IFNAME"]) == (lo, "ib0")
    assert (forked["MASTER_ADDR"], forked["MASTER_PORT"], forked["TORCHELASTIC_USE_AGENT_STORE"]) == (
        "127.0.0.1", "12345", "True")
    torchrun = _launcher_env({}, srun=False, use_srun=None, nproc=2)
    assert torchrun["GLOO_SOCKET_IFNAME"] == lo == torchrun["NCCL_SOCKET_IFNAME"]
    srun = _launcher_env({"SLURM_NTASKS": "2"}, srun=True, use_srun=None, nproc=2)
    assert "GLOO_SOCKET_IFNAME" not in srun and "NCCL_SOCKET_IFNAME" not in srun
