"""FSDP2 prefetching (dlo.parallel.fsdp.set_prefetch) and the exposed-communication records of tp_fsdp/fsdp_train.py.

One 2-process gloo launch (tests/scripts/fsdp_prefetch_cases.py, smoke Llama, 2 steps, fp32) runs every prefetch
mode, the compute-only baseline and the workshop script's own timed runs. Everything asserted is a value or a
counted event (losses, gradients, collectives per step, all-gathers issued before a layer computes), never a
wall time.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import dlo  # noqa: F401
from dlo.parallel import fsdp
from dlo.runtime.launch import launch_forked

CASES = Path(__file__).parent / "scripts" / "fsdp_prefetch_cases.py"
LAYERS = fsdp.SMOKE_LLAMA.num_layers
RANKS = (0, 1)


@pytest.fixture(scope="module")
def records():
    recs = launch_forked(CASES, [], nproc=2, timeout_s=300, env={"OMP_NUM_THREADS": "1"})
    cases = {(r.get("case"), r.get("mode"), r["rank"]): r for r in recs if "case" in r}
    runs = {(r["run"], r["rank"]): r for r in recs if "run" in r}
    return cases, runs


def _mode(records, mode, rank):
    return records[0][("prefetch", mode, rank)]


@pytest.mark.parametrize("mode", ["none", "explicit"])
def test_every_prefetch_mode_gives_the_default_losses_and_gradients(records, mode):
    for rank in RANKS:
        rec, default = _mode(records, mode, rank), _mode(records, "default", rank)
        assert rec["losses"] == default["losses"]  # exact: prefetching moves collectives, not arithmetic
        assert rec["same_grad_names"] and rec["max_grad_diff"] <= 1e-6


def test_prefetch_modes_issue_the_same_collectives(records):
    for rank in RANKS:
        default = _mode(records, "default", rank)["collectives"]
        assert default["reduce_scatter"]["count"] == LAYERS + 1  # one per layer, one for the root
        assert default["all_gather"]["count"] >= 2 * LAYERS + 1  # each layer in forward and again in backward
        assert default["all_gather"]["bytes"] > 0 and default["reduce_scatter"]["bytes"] > 0
        for mode in ("none", "explicit"):
            assert _mode(records, mode, rank)["collectives"] == default


def test_prefetching_changes_when_the_all_gathers_are_issued(records):
    """All-gathers issued when each layer's compute starts (first step): prefetching issues them earlier."""
    for rank in RANKS:
        marks = {m: _mode(records, m, rank)["marks"] for m in fsdp.PREFETCH_MODES}
        fwd = {m: dict(marks[m]["forward"][:LAYERS]) for m in marks}
        bwd = {m: dict(marks[m]["backward"][:LAYERS]) for m in marks}
        # forward: explicit has layer 1's all-gather out before layer 0 computes; the host-side order of
        # default and none is the same (on a GPU, default's runs on its own stream, none's on the compute stream)
        assert fwd["explicit"][0] == fwd["default"][0] + 1
        assert fwd["none"] == fwd["default"]
        # backward: the default schedule gathers the next layer before computing the last one; none does not
        last = LAYERS - 1
        assert bwd["default"][last] == bwd["none"][last] + 1
        assert bwd["explicit"][last] >= bwd["default"][last]


def test_compute_only_communicates_nothing(records):
    cases, runs = records
    for rank in RANKS:
        assert cases[("compute-only", None, rank)]["collectives"] == {}
        rec = runs[("compute only", rank)]
        assert rec["compute_only"] and rec["collective_count_per_step"] == 0 and rec["collectives_per_step"] == {}


def test_script_records_step_times_collectives_and_exposed_communication(records):
    _, runs = records
    for rank in RANKS:
        base = runs[("compute only", rank)]
        assert base["status"] == "ok" and base["exposed_comm_s"] is None and base["prefetch"] is None
        for name in ("default", "none"):
            rec = runs[(name, rank)]
            assert rec["status"] == "ok" and rec["prefetch"] == name and not rec["compute_only"]
            timing = rec["timing"]
            assert len(timing["times_s"]) == 3 and timing["warmup"] == len(timing["warmup_times_s"]) >= 3
            assert timing["unit"] == "tokens/s" and timing["items_per_call"] == 4 * 32
            assert rec["collective_count_per_step"] == sum(c["count"] for c in rec["collectives_per_step"].values())
            assert rec["collectives_per_step"]["reduce_scatter"]["count"] == LAYERS + 1
            assert rec["baseline_run"] == "compute only"
            # exposed = this step's median - the baseline's; its band combines both interquartile ranges
            assert rec["exposed_comm_s"] == pytest.approx(timing["median_s"] - base["timing"]["median_s"])
            assert rec["exposed_comm_low_s"] <= rec["exposed_comm_s"] <= rec["exposed_comm_high_s"]
        assert runs[("none", rank)]["losses"] == runs[("default", rank)]["losses"]
        assert runs[("none", rank)]["collectives_per_step"] == runs[("default", rank)]["collectives_per_step"]
    # every rank takes the slowest rank's time of each step: the same numbers on both ranks
    assert runs[("default", 0)]["timing"]["times_s"] == runs[("default", 1)]["timing"]["times_s"]


def test_is_resharded_after_forward_public_observation_agrees_with_the_setting(records):
    cases, _ = records
    for rank in RANKS:
        answers = cases[("reshard", None, rank)]["answers"]
        assert answers == {"True": {"internal": True, "public": True}, "False": {"internal": False, "public": False}}


def test_set_prefetch_clear_errors():
    model = fsdp.build_llama(fsdp.SMOKE_LLAMA)
    with pytest.raises(ValueError, match="unknown prefetch mode 'later'"):
        fsdp.set_prefetch(model, "later")
    with pytest.raises(ValueError, match="depth must be an integer >= 1"):
        fsdp.set_prefetch(model, "explicit", depth=0)
    with pytest.raises(ValueError, match="needs an FSDP2 model"):
        fsdp.set_prefetch(model, "none")
    with pytest.raises(ValueError, match="not an FSDP module"):
        fsdp.is_resharded_after_forward(fsdp.decoder_layers(model)[0])


def test_collective_counter_counts_nested_calls_once_and_restores_torch_distributed(monkeypatch):
    import torch.distributed as dist

    # stand-ins (no process group here): a broadcast that calls all_reduce inside, as wrappers do
    monkeypatch.setattr(dist, "all_reduce", lambda tensor, *a, **k: None)
    monkeypatch.setattr(dist, "broadcast", lambda tensor, *a, **k: dist.all_reduce(tensor))
    real = dist.broadcast
    with fsdp.CollectiveCounter() as counter:
        assert dist.broadcast is not real
        dist.broadcast(torch.zeros(4))
        dist.all_reduce(torch.zeros(3, dtype=torch.float64))
    assert dist.broadcast is real
    assert counter.summary() == {"broadcast": {"count": 1, "bytes": 16}, "all_reduce": {"count": 1, "bytes": 24}}
    assert fsdp._collective_bytes((torch.zeros(4), [torch.zeros(10)]), {}) == 40
