"""dlo.runtime without spawning processes: devices, distributed context, node lists, records, commands."""
from __future__ import annotations

import dataclasses
import json
import os
import sys

import pytest
import torch

import dlo  # noqa: F401
from dlo.runtime import (DEFAULT_MASTER_PORT, DistContext, build_launch_command, dist_context, distributed, expand_nodelist, free_port, init_distributed, launch, pick_device, read_records, write_record)

_DIST_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
              "TORCHELASTIC_RUN_ID", "DLO_RECORDS_DIR", "DLO_DEVICE")


@pytest.fixture
def clean_env(monkeypatch):
    """A process that looks started by hand: no torchrun, Slurm, dlo variables."""
    for name in list(os.environ):
        if name in _DIST_VARS or name.startswith("SLURM_"):
            monkeypatch.delenv(name)
    return monkeypatch


no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour of a machine without GPU")


# ---------------------------------------------------------------------------------------------- devices
@no_gpu
def test_pick_device_auto_is_cpu_without_gpu(clean_env):
    assert pick_device() == torch.device("cpu")
    assert pick_device("auto") == torch.device("cpu")
    assert pick_device("CPU") == torch.device("cpu")
    assert pick_device(torch.device("cpu")) == torch.device("cpu")


@no_gpu
@pytest.mark.parametrize("name", ["cuda", "cuda:0", "cuda:3"])
def test_pick_device_cuda_without_gpu_is_one_clear_line(clean_env, name):
    with pytest.raises(ValueError) as err:
        pick_device(name)
    msg = str(err.value)
    assert "\n" not in msg
    assert f"device {name!r} was requested but no GPU is visible" in msg
    assert "device='auto' or 'cpu'" in msg


def test_pick_device_unknown_string(clean_env):
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        pick_device("tpu")
    with pytest.raises(ValueError, match="unknown device"):
        pick_device("cuda:x")


def test_pick_device_env_override(clean_env):
    clean_env.setenv("DLO_DEVICE", "cpu")
    assert pick_device() == torch.device("cpu")
    clean_env.setenv("DLO_DEVICE", "gpu-please")
    with pytest.raises(ValueError, match=r"DLO_DEVICE"):
        pick_device()
    assert pick_device("cpu") == torch.device("cpu")  # an explicit argument wins over the variable


# ---------------------------------------------------------------------------------------------- context
def test_dist_context_torchrun():
    env = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
           "MASTER_ADDR": "node7", "MASTER_PORT": "29400", "TORCHELASTIC_RUN_ID": "x",
           # torchrun inside an srun task: torchrun's numbers win
           "SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": "n[1-2]"}
    ctx = dist_context(env)
    assert ctx == DistContext(rank=3, local_rank=1, world_size=4, local_world_size=2, master_addr="node7",
                              master_port=29400, source="torchrun", node_rank=1)
    assert not ctx.is_main and ctx.is_distributed


def test_dist_context_torchrun_minimal_and_invalid():
    ctx = dist_context({"RANK": "0", "WORLD_SIZE": "2"})
    assert (ctx.local_rank, ctx.local_world_size, ctx.source) == (0, 2, "torchrun")
    assert ctx.master_port == DEFAULT_MASTER_PORT
    with pytest.raises(ValueError, match="outside 0..1"):
        dist_context({"RANK": "2", "WORLD_SIZE": "2"})
    with pytest.raises(ValueError, match="RANK='one' is not an integer"):
        dist_context({"RANK": "one", "WORLD_SIZE": "2"})
    with pytest.raises(ValueError, match="must both be >= 1"):
        dist_context({"RANK": "0", "WORLD_SIZE": "0"})
    with pytest.raises(ValueError, match="RANK is required"):
        dist_context({"WORLD_SIZE": "2"})


def _slurm(**extra):
    env = {"SLURM_JOB_ID": "123456", "SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NODEID": "2",
           "SLURM_NTASKS": "8", "SLURM_STEP_ID": "0", "SLURM_STEP_TASKS_PER_NODE": "2(x4)",
           "SLURM_STEP_NODELIST": "gpu[003-006]", "SLURM_JOB_NODELIST": "gpu[001-008]"}
    env.update(extra)
    return {k: v for k, v in env.items() if v is not None}


def test_dist_context_slurm():
    ctx = dist_context(_slurm())
    assert ctx == DistContext(rank=5, local_rank=1, world_size=8, local_world_size=2,
                              master_addr="gpu003",  # the step's node list wins over the job's
                              master_port=20000 + 123456 % 20000, source="slurm", node_rank=2)


def test_dist_context_slurm_fallbacks_and_overrides():
    ctx = dist_context(_slurm(SLURM_NTASKS=None, SLURM_STEP_NUM_TASKS="6", SLURM_STEP_NODELIST=None,
                              SLURM_STEP_TASKS_PER_NODE=None, SLURM_NTASKS_PER_NODE="2"))
    assert (ctx.world_size, ctx.master_addr, ctx.local_world_size) == (6, "gpu001", 2)
    # an srun -n 2 inside an 8-task job: the step is what counts
    assert dist_context(_slurm(SLURM_PROCID="1", SLURM_STEP_NUM_TASKS="2")).world_size == 2
    # uneven tasks per node: the count of *this* node (node id 2 -> third entry)
    assert dist_context(_slurm(SLURM_STEP_TASKS_PER_NODE="3(x2),1,1", SLURM_LOCALID="0")).local_world_size == 1
    ctx = dist_context(_slurm(MASTER_PORT="31000", MASTER_ADDR="gpu003-ib"))
    assert (ctx.master_addr, ctx.master_port) == ("gpu003-ib", 31000)
    # the same job id always gives the same port, on every task
    assert dist_context(_slurm(SLURM_PROCID="0")).master_port == dist_context(_slurm()).master_port


def test_dist_context_slurm_batch_script_is_single():
    """The batch script / a notebook inside an allocation is ONE process, whatever SLURM_NTASKS says."""
    env = {"SLURM_JOB_ID": "42", "SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_JOB_NODELIST": "n[1-2]"}
    ctx = dist_context(env)
    assert (ctx.source, ctx.world_size, ctx.rank) == ("single", 1, 0)


def test_dist_context_slurm_exported_for_env_init_stays_slurm():
    env = _slurm(RANK="5", WORLD_SIZE="8", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2",
                 MASTER_ADDR="gpu003", MASTER_PORT="23456")
    assert dist_context(env).source == "slurm"


def test_dist_context_single():
    ctx = dist_context({})
    assert ctx == DistContext(rank=0, local_rank=0, world_size=1, local_world_size=1, master_addr="127.0.0.1",
                              master_port=DEFAULT_MASTER_PORT, source="single", node_rank=0)
    assert ctx.is_main and not ctx.is_distributed
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.rank = 1  # type: ignore[misc]


def test_init_distributed_single_process_creates_no_group(clean_env):
    import torch.distributed as dist

    ctx = init_distributed()
    assert ctx.source == "single" and not dist.is_initialized()
    with distributed() as ctx2:
        assert ctx2 == ctx and not dist.is_initialized()
    with pytest.raises(ValueError, match="nccl"):
        init_distributed(backend="nccl", device="cpu")
    with pytest.raises(ValueError, match="timeout_s"):
        init_distributed(timeout_s=0)


# ---------------------------------------------------------------------------------------------- node lists
@pytest.mark.parametrize(
    "text, hosts",
    [
        ("node1", ["node1"]),
        ("n[1-3]", ["n1", "n2", "n3"]),
        ("jean-zay-iam[01-04,07]", [f"jean-zay-iam0{i}" for i in (1, 2, 3, 4, 7)]),
        ("a[1-2],b5", ["a1", "a2", "b5"]),
        ("gpu[001-002]-ib", ["gpu001-ib", "gpu002-ib"]),
        ("n[8-10]", ["n8", "n9", "n10"]),
        ("n[08-10]", ["n08", "n09", "n10"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("x[1,3],y[2-3],z", ["x1", "x3", "y2", "y3", "z"]),
        (" node1 ", ["node1"]),
    ],
)
def test_expand_nodelist(text, hosts):
    assert expand_nodelist(text) == hosts


@pytest.mark.parametrize("bad", ["", "   ", "n[1-3", "n1-3]", "n[[1-2]]", "n[]", "n[1-]", "n[a-b]", "n[3-1]",
                                 "a,,b", "a,", "n[1-2] ,b", "n 1"])
def test_expand_nodelist_malformed(bad):
    with pytest.raises(ValueError) as err:
        expand_nodelist(bad)
    assert "\n" not in str(err.value)


# ---------------------------------------------------------------------------------------------- records
def test_write_and_read_records(clean_env, tmp_path):
    assert write_record({"x": 1}) is None  # no DLO_RECORDS_DIR: a no-op, so scripts run standalone
    path = write_record({"step": 1, "loss": torch.tensor(0.5), "shape": torch.zeros(2).shape}, tmp_path)
    assert path == tmp_path / "rank0.jsonl"
    clean_env.setenv("DLO_RECORDS_DIR", str(tmp_path))
    write_record({"step": 2, "loss": 0.25})
    # another rank's file, as a second process would write it
    (tmp_path / "rank10.jsonl").write_text(json.dumps({"step": 1, "rank": 10, "world_size": 11}) + "\n")
    (tmp_path / "rank2.jsonl").write_text(json.dumps({"step": 1, "rank": 2, "world_size": 11}) + "\n\n")
    (tmp_path / "notes.txt").write_text("ignored")
    records = read_records(tmp_path)
    assert [(r["rank"], r["step"]) for r in records] == [(0, 1), (0, 2), (2, 1), (10, 1)]
    assert records[0] == {"step": 1, "loss": 0.5, "shape": [2], "rank": 0, "world_size": 1}
    assert read_records() == records  # defaults to $DLO_RECORDS_DIR


def test_records_errors(clean_env, tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        read_records(tmp_path / "missing")
    with pytest.raises(ValueError, match="not set"):
        read_records()
    with pytest.raises(ValueError, match="rank=3"):
        write_record({"rank": 3}, tmp_path)
    with pytest.raises(TypeError, match="not JSON-serialisable"):
        write_record({"f": object()}, tmp_path)
    (tmp_path / "rank1.jsonl").write_text('{"a": 1}\n{"a": \n')
    with pytest.raises(ValueError, match=r"rank1.jsonl:2"):
        read_records(tmp_path)


# ---------------------------------------------------------------------------------------------- commands
def test_build_launch_command_torchrun():
    cmd = build_launch_command("train.py", ["--epochs", 3], 4, None, environ={})
    assert cmd[:3] == [sys.executable, "-m", "dlo.runtime.loopback"]  # torchrun, its stores on 127.0.0.1
    assert "--standalone" in cmd and cmd[cmd.index("--nproc-per-node") + 1] == "4"
    assert cmd[cmd.index("--local-addr") + 1] == "127.0.0.1"
    assert cmd[cmd.index("--tee") + 1] == "3"
    assert cmd[-3:] == ["train.py", "--epochs", "3"]
    assert "--log-dir" in build_launch_command("t.py", (), 2, False, {}, log_dir="/x")


def test_build_launch_command_srun():
    cmd = build_launch_command("train.py", ["--lr", "0.1"], 8, None, environ={"SLURM_JOB_ID": "77"})
    assert cmd[0] == "srun" and cmd[cmd.index("--ntasks") + 1] == "8"
    assert "--kill-on-bad-exit=1" in cmd and "--label" in cmd
    assert cmd[-4:] == [sys.executable, "train.py", "--lr", "0.1"]
    assert build_launch_command("t.py", (), 2, True, environ={})[0] == "srun"  # forced
    assert build_launch_command("t.py", (), 2, False, environ={"SLURM_JOB_ID": "1"})[0] == sys.executable  # refused


@pytest.mark.parametrize("nproc", [0, -1, 1.5, True])
def test_bad_nproc(nproc, tmp_path):
    with pytest.raises(ValueError, match="nproc"):
        build_launch_command("t.py", (), nproc, False, {})
    script = tmp_path / "t.py"
    script.write_text("")
    with pytest.raises(ValueError, match="nproc"):
        launch(script, nproc=nproc)


def test_launch_bad_input(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        launch(tmp_path / "missing.py")
    script = tmp_path / "t.py"
    script.write_text("")
    with pytest.raises(ValueError, match="list of strings"):
        launch(script, args="--epochs 3")
    (tmp_path / "rank0.jsonl").write_text("{}\n")
    with pytest.raises(ValueError, match="already holds"):
        launch(script, records_dir=tmp_path)


def test_free_port_is_bindable_outside_the_ephemeral_range_and_leaves_random_alone(monkeypatch):
    """A port from the ephemeral range can be taken as an outgoing connection's source port before rank 0 binds it
    (EADDRINUSE in a busy CI); a seeded ``random`` in the caller must draw what it would have drawn."""
    import random
    import socket

    from dlo.runtime import context

    low, high = context._ephemeral_ports()
    random.seed(0)
    expected = random.random()
    random.seed(0)
    ports = [free_port() for _ in range(20)]
    assert random.random() == expected
    assert all(10000 <= p < low or high < p < 65536 for p in ports), (low, high, ports)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", ports[-1]))
    monkeypatch.setattr(context, "_ephemeral_ports", lambda: (1024, 60999))  # no room below: above the range
    assert all(60999 < free_port() < 65536 for _ in range(5))


def test_expand_runs_overrides_names_and_rejects_unknown_options():
    import argparse

    from dlo.runtime import expand_runs

    args = argparse.Namespace(lr=0.1, steps=3, runs=None)
    assert [(n, vars(a)) for n, a in expand_runs(args, None)] == [("run0", {"lr": 0.1, "steps": 3, "runs": None})]
    runs = expand_runs(args, '[{"name": "fast", "lr": 1.0}, {"steps": 5}]')
    assert [n for n, _ in runs] == ["fast", "run1"]
    assert (runs[0][1].lr, runs[0][1].steps, runs[1][1].lr, runs[1][1].steps) == (1.0, 3, 0.1, 5)
    assert args.lr == 0.1  # the parsed options are not modified
    with pytest.raises(ValueError, match="--runs entry 'x' sets unknown option\\(s\\) lrr: use lr, runs, steps"):
        expand_runs(args, '[{"name": "x", "lrr": 1}]')
    with pytest.raises(ValueError, match="--runs must be a JSON list of dicts"):
        expand_runs(args, '{"lr": 1}')


def test_group_of_one_for_a_single_process(monkeypatch):
    """FSDP2, DCP and DeepSpeed need a process group even alone: group_of_one makes one of size 1."""
    import subprocess

    code = ("import dlo, os, torch.distributed as dist\n"
            "from dlo.runtime import init_distributed, teardown\n"
            "ctx = init_distributed(group_of_one=True)\n"
            "print(dist.is_initialized(), dist.get_world_size(), ctx.is_distributed, os.environ['LOCAL_RANK'])\n"
            "teardown()\n"
            "ctx = init_distributed()\n"
            "print(dist.is_initialized())\n")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_JOB_ID",
                                                             "SLURM_PROCID", "SLURM_NTASKS")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "1", "False", "0", "False"]


@pytest.mark.parametrize("keep_group", [False, True])
def test_exit_after_success_flushes_and_keeps_the_group_only_when_asked(keep_group):
    """It leaves with the given code, its unflushed output still written; the process group is destroyed unless
    ``keep_group`` (after a barrier, for ranks seen hanging inside the destruction)."""
    import subprocess
    import sys

    code = ("import sys, dlo.runtime.distributed\n"
            "d = sys.modules['dlo.runtime.distributed']  # (dlo.runtime.distributed is also a function's name)\n"
            "d.teardown = lambda: print('teardown', end=' ')\n"
            "print('done', end='')\n"
            f"d.exit_after_success(3, keep_group={keep_group})\n"
            "print('never')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 3
    assert ("teardown" in out.stdout) is (not keep_group) and "done" in out.stdout and "never" not in out.stdout
