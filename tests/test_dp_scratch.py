"""Jour2/dp_scratch: data parallelism written by hand, equal to DDP and to one process, and its event timeline.

Three launches in all (process start-up costs seconds on 2 cores): the checker's worker with the reference
solution on 2 and on 4 gloo processes (every step's gradients against DDP's and against one process on the
global batch), and the course script's own measurement run, tiny, on 2 processes. Assertions are on values
and counted events, never on time.
"""
from __future__ import annotations

import contextlib
import json
import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

import dlo  # noqa: F401
from dlo.course import checks
from dlo.course.checks import dp_scratch as checker
from dlo.course.dp_scratch_cases import STEPS, TOL, load_script
from dlo.parallel import Timeline, agreed_timer, comm_gantt, exposed_comm_s, record_collectives
from dlo.runtime import launch
from dlo.runtime.paths import ROOT

SCRIPT = ROOT / "Jour2" / "dp_scratch_train.py"
distributed = pytest.mark.distributed


@pytest.fixture(scope="module")
def solution():
    return load_script(SCRIPT)


@pytest.fixture
def group_of_one():
    with checker.one_process_group():
        yield


# ----------------------------------------------------------------------------------------------------
# The hand-written versions against DDP and one process, at 2 and 4 processes
# ----------------------------------------------------------------------------------------------------
@distributed
@pytest.mark.parametrize("nproc", [2, 4])
def test_hand_written_gradients_equal_ddp_and_one_process(nproc):
    results = checker.peer_results(SCRIPT, nproc=nproc, timeout_s=900)
    assert set(results) == set(STEPS)
    for step, res in results.items():
        assert res["verdict"] == "ok", f"{step} at {nproc} processes: {res['verdict']}"
        assert sorted(int(r) for r in res["diffs"]) == list(range(nproc)), "every rank must answer"
    for step in ("naive", "overlap", "buckets"):
        for rank, diffs in results[step]["diffs"].items():
            # the largest gradient difference (last set-up, fp64) against DDP on the same slices and one process on
            # the global batch
            assert diffs["ddp"] <= 10 * TOL and diffs["single"] <= 10 * TOL, (step, nproc, rank, diffs)
    for rank, diffs in results["no_sync"]["diffs"].items():
        # the weights after two accumulated steps, and after one with DDP's own no_sync, against one process
        assert diffs["single"] <= 10 * TOL and diffs["ddp_no_sync"] <= 10 * TOL, (nproc, rank, diffs)


def test_every_step_is_registered_with_hints():
    from dlo.course import hints

    assert set(checks.REGISTRY["dp_scratch"]) == set(STEPS)
    for step in STEPS:
        assert hints.goal("dp_scratch", step)


# ----------------------------------------------------------------------------------------------------
# In one process (a group of one)
# ----------------------------------------------------------------------------------------------------
def test_plan_buckets_follows_ddp_rule(solution):
    plan_buckets = solution["plan_buckets"]
    params = [torch.empty(n) for n in (10, 3, 7, 20, 5, 8, 2)]
    for cap in (1, 40, 48, 100, 10**9):
        ours = plan_buckets(params, cap)
        # DDP's own assignment of the reversed parameters, mapped back to registration indices
        theirs, _ = dist._compute_bucket_assignment_by_size(list(reversed(params)), [cap])
        assert ours == [[len(params) - 1 - i for i in b] for b in theirs], cap
        assert sorted(i for b in ours for i in b) == list(range(len(params)))


def test_overlap_launches_one_async_all_reduce_per_parameter_during_backward(solution, group_of_one):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3))
    sync = solution["OverlappedGradSync"](model)
    timeline = Timeline()
    with record_collectives(timeline):
        with timeline.span("backward"):
            model(torch.randn(2, 5)).sum().backward()
        sync.finish()
    calls = timeline.collectives()
    assert len(calls) == 4 and all(c["async_op"] and c["waited"] and c["during"] == "backward" for c in calls)
    # backward reaches the last layer first: its weight and bias are all-reduced before the first layer's
    assert [c["numel"] for c in calls][:2] in ([3, 12], [12, 3]) and [c["numel"] for c in calls][2:] in ([4, 20], [20, 4])
    assert not sync.pending
    sync.remove()
    assert not sync.hook_handles


def test_buckets_launch_one_all_reduce_per_bucket(solution, group_of_one):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3))  # 20, 4, 12, 3 values
    sync = solution["BucketedGradSync"](model, 60)  # bytes: [3, 12] = 60 -> closed; [4, 20] = 96 -> closed
    assert sync.plan == [[3, 2], [1, 0]]
    timeline = Timeline()
    with record_collectives(timeline):
        with timeline.span("backward"):
            model(torch.randn(2, 5)).sum().backward()
        sync.finish()
    assert [c["numel"] for c in timeline.collectives()] == [15, 24]
    assert sync.ready == [0, 0] and not sync.pending


def test_no_sync_restores_synchronisation(solution):
    sync = solution["LocalOnly"](nn.Linear(2, 2))
    with pytest.raises(ValueError):
        with sync.no_sync():
            assert sync.require_sync is False
            raise ValueError("inside")
    assert sync.require_sync is True


def test_record_collectives_restores_all_reduce_and_sees_blocking_calls(group_of_one):
    real = dist.all_reduce
    timeline = Timeline()
    with record_collectives(timeline):
        assert dist.all_reduce is not real
        t = torch.ones(3)
        dist.all_reduce(t)
        work = dist.all_reduce(t, async_op=True)
        assert not timeline.collectives()[1]["waited"]
        work.wait()
    assert dist.all_reduce is real
    calls = timeline.collectives()
    assert [c["async_op"] for c in calls] == [False, True] and all(c["waited"] for c in calls)
    assert all(c["bytes"] == 12 and c["end_s"] >= c["start_s"] >= 0 for c in calls)


def test_deferred_handles_deliver_at_wait_and_order_the_events(group_of_one):
    """With defer=True an asynchronous result lands in its tensor at wait() only, and the event order shows
    whether anything happened between a launch and its wait."""
    timeline = Timeline()
    t, u = torch.ones(3), torch.ones(2)
    with record_collectives(timeline, defer=True):
        with timeline.span("backward"):
            work = dist.all_reduce(t, async_op=True)
            t.mul_(0)  # the copy being reduced is not this tensor: the result overwrites it at wait()
            other = dist.all_reduce(u, async_op=True)
            other.wait()  # at once
        assert not work.is_completed() and torch.equal(t, torch.zeros(3))
        work.wait()
        assert work.is_completed() and torch.equal(t, torch.ones(3))
        never = dist.all_reduce(torch.ones(1), async_op=True)
    first, second, third = timeline.collectives()
    bwd = next(e for e in timeline.events if e["name"] == "backward")
    assert first["wait_seq"] > bwd["end_seq"] > second["wait_seq"] == second["seq"] + 1
    assert first["wait_during"] is None and second["wait_during"] == "backward"
    assert third["wait_seq"] is None and not third["waited"] and never is not None


def test_checker_messages_name_known_mistakes(solution, group_of_one):
    """Two mistakes that differ only in behaviour, told apart in one process by the event order."""
    from dlo.course.dp_scratch_cases import run_case

    base = solution["GradSync"]

    class WaitsAtOnce(solution["OverlappedGradSync"]):
        def _on_grad_ready(self, param):
            if self.require_sync:
                dist.all_reduce(param.grad, async_op=True).wait()

        def finish(self):
            pass

    verdict = run_case("overlap", {"OverlappedGradSync": WaitsAtOnce})["verdict"]
    assert "waited for inside the hook" in verdict, verdict

    def step_first(model, sync, micro, criterion, optimizer):
        optimizer.zero_grad()
        for i, (x, y) in enumerate(micro):
            with sync.no_sync() if i < len(micro) - 1 else contextlib.nullcontext():
                (criterion(model(x), y) / len(micro)).backward()
        optimizer.step()
        sync.finish()
        return torch.tensor(0.0)

    verdict = run_case("no_sync", {"GradSync": base, "train_step_accumulated": step_first})["verdict"]
    assert "optimizer stepped before the gradients were averaged" in verdict, verdict


def test_agreed_timer_times_the_call(group_of_one):
    calls = []
    seconds = agreed_timer("cpu")(lambda: calls.append(1))
    assert calls == [1] and seconds >= 0.0


def test_exposed_comm_and_gantt_from_events():
    events = [
        {"lane": "compute", "name": "forward", "start_s": 0.0, "end_s": 1.0},
        {"lane": "compute", "name": "backward", "start_s": 1.0, "end_s": 3.0},
        {"lane": "comm", "name": "all_reduce", "start_s": 1.5, "end_s": 2.5},
        {"lane": "comm", "name": "all_reduce", "start_s": 2.0, "end_s": 3.75},
        {"lane": "compute", "name": "wait", "start_s": 3.0, "end_s": 3.75},
    ]
    assert exposed_comm_s(events) == pytest.approx(0.75)
    assert exposed_comm_s([e for e in events if e["lane"] == "compute"]) == 0.0
    import matplotlib

    matplotlib.use("Agg")
    fig = comm_gantt([events, events], title="two ranks")
    assert len(fig.axes[0].patches) == 2 * len(events)
    import matplotlib.pyplot as plt

    plt.close(fig)


# ----------------------------------------------------------------------------------------------------
# The course script's measurement run (what the notebook launches), tiny
# ----------------------------------------------------------------------------------------------------
@distributed
def test_course_script_run_records_drift_events_and_timings(tmp_path):
    args = ["--image-size", "8", "--hidden", "16,16", "--per-rank-batch", "4", "--bucket-mb", "0.001,25", "--accum", "2",
            "--accum-bucket-mb", "0.001", "--gantt-bucket-mb", "0.001", "--repeats", "2", "--warmup-max-calls", "3",
            "--gantt-steps", "2", "--drift-steps", "2"]
    records = launch(SCRIPT, args, nproc=2, records_dir=tmp_path / "records", timeout_s=900, use_srun=False,
                     echo=False, env={"OMP_NUM_THREADS": "1"})
    setup = next(r for r in records if r["kind"] == "setup")
    assert setup["tensors"] == 6 and setup["plans"]["25.0"] == [[5, 4, 3, 2, 1, 0]]
    drift = next(r for r in records if r["kind"] == "drift")
    assert drift["with broadcast"] == 0.0 and drift["without broadcast"] > 1e-3
    events = {(r["version"], r["rank"]): r["events"] for r in records if r["kind"] == "events"}
    assert {v for v, _ in events} == {"naive", "overlap", "buckets 0.001 MiB", "DDP (25 MiB default)"}
    for (version, rank), evs in events.items():
        comm = [e for e in evs if e["lane"] == "comm"]
        names = [e["name"] for e in evs if e["lane"] == "compute"]
        assert names == ["forward", "backward", "wait", "optimizer"], (version, names)
        if version == "naive":  # after backward, blocking, one per parameter
            assert len(comm) == 6 and all(e["during"] == "wait" and not e["async_op"] for e in comm)
        if version == "overlap":
            assert len(comm) == 6 and all(e["during"] == "backward" and e["async_op"] for e in comm)
        if version.startswith("buckets"):  # 0.001 MiB = 1048 bytes: the plan of the setup record
            assert len(comm) == len(json.loads(json.dumps(setup["plans"]["0.001"])))
        if version.startswith("DDP"):  # after its first step, DDP has rebuilt its buckets: one here (all < 25 MiB)
            assert len(comm) >= 1 and all(e["during"] == "backward" for e in comm)
    timings = {r["name"]: r for r in records if r["kind"] == "timing"}
    assert {"compute only", "naive", "overlap", "DDP (25 MiB default)", "buckets 0.001 MiB", "buckets 25 MiB",
            "DDP bucket_cap_mb=0.001"} <= set(timings)
    assert all(len(r["times_s"]) == 2 and r["rank"] == 0 for r in timings.values())
    assert timings["naive"]["items_per_call"] == 8
    assert timings["accumulate 2: DDP (25 MiB default)"]["items_per_call"] == 16
