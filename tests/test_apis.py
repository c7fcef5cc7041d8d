"""The high-level APIs lesson (tp_fsdp/apis_train.py, dlo.lessons.apis): native FSDP2, Accelerate and Fabric train
the same smoke Llama to the same losses, sharding shows in the bytes each rank holds, Accelerate's YAML is one
Accelerate reads, and what cannot run says so in one line.

One 2-process gloo launch per API/strategy (smoke Llama, 4 steps, fp32). Everything asserted is a value or a
counted byte, never a wall time.

Loss tolerance: 1e-5 relative on the loss of the global batch (the ranks' losses averaged). All runs use fp32
and the same global batches, but the APIs deal sequences to ranks differently (DistributedSampler interleaves,
Accelerate gives each rank contiguous batches) and reduce gradients with different collectives (reduce-scatter,
all-reduce), so sums are taken in a different order: a few float32 ulps per step (measured: < 1e-7), far
below what a real difference (one wrong gradient average, one unsynchronised rank) makes (> 1e-3 after 1 step).
"""
from __future__ import annotations

import importlib.util
import json
import runpy
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import dlo  # noqa: F401
from dlo.lessons import apis
from dlo.models.llama import Llama
from dlo.runtime import launch

SMOKE = apis.MODELS["smoke"]
ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tp_fsdp" / "apis_train.py"
NOTEBOOK = ROOT / "tp_fsdp" / "apis.ipynb"
ARGS = ["--model", "smoke", "--steps", "4", "--warmup-steps", "1", "--seq-len", "16", "--global-batch", "4"]
ENV = {"OMP_NUM_THREADS": "1"}
REL_TOL = 1e-5
RUNS = [("native", "fsdp"), ("native", "ddp"), ("accelerate", "fsdp"), ("fabric", "fsdp"), ("fabric", "ddp")]

needs = {
    "accelerate": pytest.mark.skipif(apis.missing_library("accelerate") is not None, reason="accelerate not installed"),
    "fabric": pytest.mark.skipif(apis.missing_library("lightning_fabric") is not None, reason="Fabric not installed"),
}


def _full_param_bytes() -> int:
    model = Llama(SMOKE, seed=0)
    return sum(p.numel() * p.element_size() for p in model.parameters())  # parameters() counts a tied weight once


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{(api, strategy): records of its 2 ranks}, one launch each; an API whose library is missing is left out."""
    out = {}
    # each launch takes 5-30 s on a busy 2-core machine: a hung one fails at 240 s (with every process's stack in its
    # log, for Accelerate) instead of holding a test worker for many minutes
    for api, strategy in RUNS:
        if apis.unavailable_reason(api, strategy, "cpu"):
            continue
        args = ARGS + ["--api", api, "--strategy", strategy]
        folder = tmp_path_factory.mktemp(f"{api}-{strategy}")
        if api == "accelerate":
            config = apis.write_accelerate_config(folder / "accelerate.yaml", strategy, 2, cpu=True)
            recs = apis.launch_accelerate(SCRIPT, args, config, records_dir=folder / "records", env=ENV, echo=False,
                                          timeout_s=240)
        else:
            recs = launch(SCRIPT, args, nproc=2, records_dir=folder / "records", env=ENV, echo=False, timeout_s=240,
                          use_srun=False)
        out[(api, strategy)] = sorted(recs, key=lambda r: r["rank"])
    return out


def _run(runs, api, strategy):
    if (api, strategy) not in runs:
        pytest.skip(f"{api} is not installed here")
    return runs[(api, strategy)]


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("api, strategy", [r for r in RUNS if r != ("native", "fsdp")])
def test_every_api_trains_to_the_native_fsdp2_losses(runs, api, strategy):
    reference = apis.rank_mean_losses(_run(runs, "native", "fsdp"))
    losses = apis.rank_mean_losses(_run(runs, api, strategy))
    assert len(losses) == 4
    gap = apis.max_relative_gap(losses, reference)
    assert gap <= REL_TOL, f"{api} {strategy}: losses differ from native FSDP2 by {gap:.2e} (relative)"
    # the losses move: the runs did train (a run that skipped optimizer.step would still match at step 0 only)
    assert losses[0] != losses[-1]


@pytest.mark.slow
@pytest.mark.distributed
def test_the_check_tells_training_from_not_training(runs):
    """The tolerance is tight enough: the same runs with the steps shifted by one are far apart."""
    reference = apis.rank_mean_losses(_run(runs, "native", "fsdp"))
    assert apis.max_relative_gap(reference[1:], reference[:-1]) > 100 * REL_TOL


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("api, strategy", RUNS)
def test_per_rank_bytes_show_the_sharding(runs, api, strategy):
    full = _full_param_bytes()
    records = _run(runs, api, strategy)
    resolved = records[0]["resolved"]
    sharded = resolved["sharded"]
    for rec in records:
        held = rec["held_bytes"]
        assert held["params"] == (full // 2 if sharded else full), (api, strategy, rec["rank"], held, full)
        assert held["grads"] == held["params"]  # one gradient per parameter, sharded like it
        assert held["optimizer"] == 2 * held["params"]  # AdamW: exp_avg and exp_avg_sq
        assert rec["memory_kind"] == "tensors_counted" and rec["peak_memory_bytes"] == sum(held.values())
    if strategy == "fsdp" and api != "accelerate":
        assert sharded, f"{api} fsdp did not shard: {resolved}"
    if strategy == "ddp":
        assert not sharded


@pytest.mark.slow
@pytest.mark.distributed
@needs["accelerate"]
def test_accelerate_fsdp_on_a_cpu_is_ddp_and_the_run_says_so(runs):
    """Accelerate 1.15 turns on its FSDP plugin only for GPU-like devices: on CPUs it trains with DDP
    (``MULTI_CPU``), full copies on every rank. The record shows it (what the notebook reports)."""
    resolved = _run(runs, "accelerate", "fsdp")[0]["resolved"]
    assert resolved["distributed_type"] == "MULTI_CPU" and resolved["num_processes"] == 2
    assert not resolved["sharded"] and "DDP" in resolved["summary"]


@pytest.mark.slow
@pytest.mark.distributed
def test_resolved_configs_name_what_each_api_set_up(runs):
    assert "fully_shard" in _run(runs, "native", "fsdp")[0]["resolved"]["summary"]
    assert _run(runs, "native", "ddp")[0]["resolved"]["wrapper"] == "DistributedDataParallel"
    if ("fabric", "fsdp") in runs:
        assert runs[("fabric", "fsdp")][0]["resolved"]["strategy"] == "ModelParallelStrategy"
        assert runs[("fabric", "ddp")][0]["resolved"]["strategy"] == "DDPStrategy"


@pytest.mark.slow
@pytest.mark.distributed
def test_step_times_and_their_spread_are_recorded(runs):
    rows = apis.runs_table({f"{a} {s}": recs for (a, s), recs in runs.items()}, reference="native fsdp")
    for row in rows:
        t = row["timing"]
        assert t["repeats"] == 3 and t["warmup"] == 1  # 4 steps, 1 left out
        assert 0 < t["q25_s"] <= t["median_s"] <= t["q75_s"]
        assert row["max_rel_loss_gap"] <= REL_TOL


# ---------------------------------------------------------------------------------------------------
# Accelerate's YAML
# ---------------------------------------------------------------------------------------------------

@needs["accelerate"]
@pytest.mark.parametrize("strategy, expected", [("fsdp", "FSDP"), ("ddp", "MULTI_GPU"), ("deepspeed", "DEEPSPEED")])
def test_the_accelerate_yaml_is_one_accelerate_reads(tmp_path, strategy, expected):
    path = apis.write_accelerate_config(tmp_path / f"{strategy}.yaml", strategy, 2, cpu=True)
    cfg = apis.read_accelerate_config(path)
    assert cfg.distributed_type.value == expected and cfg.num_processes == 2 and cfg.use_cpu
    if strategy == "fsdp":
        assert cfg.fsdp_config["fsdp_version"] == 2
        assert cfg.fsdp_config["fsdp_transformer_layer_cls_to_wrap"] == "DecoderBlock"
    if strategy == "deepspeed":
        assert cfg.deepspeed_config["zero_stage"] == 3


def test_the_notebook_writes_its_accelerate_yaml_with_the_tested_function():
    code = "\n".join("".join(c["source"]) for c in json.loads(NOTEBOOK.read_text())["cells"] if c["cell_type"] == "code")
    assert "apis.write_accelerate_config(" in code and "launch_accelerate(" in code


def _launch_source(tmp_path, source: str, timeout_s: float) -> list[dict]:
    """``accelerate launch`` of a 2-rank DDP config on ``source`` written as a script (records in tmp_path/records)."""
    script = tmp_path / "script.py"
    script.write_text(source)
    config = apis.write_accelerate_config(tmp_path / "ddp.yaml", "ddp", 2, cpu=True)
    records = apis.launch_accelerate(script, [], config, records_dir=tmp_path / "records", echo=False,
                                     timeout_s=timeout_s)
    return records


@pytest.mark.slow
@needs["accelerate"]
def test_a_failing_accelerate_launch_is_one_line_naming_the_error(tmp_path):
    with pytest.raises(RuntimeError) as err:
        _launch_source(tmp_path, "raise ValueError('the batch does not split over the ranks')\n", timeout_s=300)
    message = str(err.value)
    assert "\n" not in message and "ValueError: the batch does not split over the ranks" in message, message
    assert (tmp_path / "records" / "launch.log").is_file()


@pytest.mark.slow
@needs["accelerate"]
def test_a_hanging_accelerate_launch_is_stopped_at_its_timeout_and_its_log_says_where(tmp_path, monkeypatch):
    """Both ranks hang; the launch is stopped at its time-out, and its log shows where each rank was. The time-out is
    a ceiling for a busy machine (ranks take 5-30 s to start there): the launcher's clock is moved past it as soon as
    both ranks are inside the hang, so the test waits for that, not for a fixed time."""
    import types

    from dlo.lessons import apis_launch

    arrived = tmp_path / "arrived"
    arrived.mkdir()
    hangs = ("import os\nimport time\n\n\ndef wait_for_a_peer_that_never_comes():\n"
             f"    open(os.path.join({str(arrived)!r}, os.environ['RANK']), 'w').close()\n    time.sleep(300)\n\n\n"
             "wait_for_a_peer_that_never_comes()\n")
    timeout_s = 240
    jumped = []

    def monotonic() -> float:
        if not jumped and len(list(arrived.iterdir())) == 2:
            jumped.append(True)
        return time.monotonic() + (timeout_s if jumped else 0)

    monkeypatch.setattr(apis_launch, "time", types.SimpleNamespace(monotonic=monotonic, strftime=time.strftime))
    with pytest.raises(RuntimeError, match=f"timed out after {timeout_s} s; where each process was is in its log"):
        _launch_source(tmp_path, hangs, timeout_s=timeout_s)
    assert jumped, "stopped before both ranks were inside the hang"
    log = (tmp_path / "records" / "launch.log").read_text()
    assert log.count("in wait_for_a_peer_that_never_comes") == 2, log[-2000:]  # both ranks' stacks


@pytest.mark.slow
@needs["accelerate"]
def test_accelerate_ranks_meet_on_a_free_port_not_on_the_shared_default(tmp_path):
    """29500 is every launcher's default on a shared node; Accelerate only checks it before use (a race)."""
    fsdp = apis.write_accelerate_config(tmp_path / "fsdp.yaml", "fsdp", 2, cpu=False)  # a GPU node's config
    assert apis.read_accelerate_config(fsdp).main_process_port == 0
    records = _launch_source(tmp_path, "import os\nfrom dlo.runtime import write_record\n"
                                       "write_record({'port': os.environ['MASTER_PORT']})\n", timeout_s=300)
    ports = {r["port"] for r in records}
    assert len(records) == 2 and len(ports) == 1 and ports != {"29500"}, records


@pytest.mark.parametrize("kwargs, message", [
    (dict(strategy="zero", nproc=2), "unknown Accelerate strategy"),
    (dict(strategy="fsdp", nproc=1), "nproc must be an integer >= 2"),
    (dict(strategy="deepspeed", nproc=2, zero_stage=1), "zero_stage must be 2 or 3"),
])
def test_bad_accelerate_configs_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        apis.accelerate_config(cpu=True, **kwargs)


# ---------------------------------------------------------------------------------------------------
# What cannot run says so, in one line
# ---------------------------------------------------------------------------------------------------

def test_a_missing_library_is_one_line(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "lightning_fabric" else real(name, *a))
    reason = apis.unavailable_reason("fabric", "ddp", "cpu")
    assert reason and "\n" not in reason and "lightning-fabric==2.6.6" in reason
    assert apis.unavailable_reason("native", "fsdp", "cpu") is None


def test_the_script_stops_with_one_line_when_accelerate_is_missing():
    code = ("import runpy, sys; sys.modules['accelerate'] = None; "
            f"sys.argv = ['apis_train.py', '--api', 'accelerate']; runpy.run_path({str(SCRIPT)!r}, run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert "accelerate is not installed" in last and "Traceback" not in proc.stderr, proc.stderr[-2000:]


def test_accelerate_deepspeed_on_a_cpu_is_refused_in_one_line():
    reason = apis.unavailable_reason("accelerate", "deepspeed", "cpu")
    assert "\n" not in reason
    if apis.missing_library("accelerate") or apis.missing_library("deepspeed"):
        assert "not installed" in reason
    else:
        assert "needs GPUs" in reason
        assert apis.unavailable_reason("accelerate", "deepspeed", "cuda") is None


@pytest.mark.parametrize("api, strategy, message", [("keras", "fsdp", "unknown API"), ("fabric", "deepspeed", "no strategy")])
def test_unknown_apis_and_strategies_are_refused(api, strategy, message):
    with pytest.raises(ValueError, match=message):
        apis.unavailable_reason(api, strategy, "cpu")


# ---------------------------------------------------------------------------------------------------
# Measuring helpers
# ---------------------------------------------------------------------------------------------------

def test_step_meter_times_the_intervals_and_counts_the_tensors_once():
    ticks = iter([10.0, 10.5, 11.5, 11.75, 12.25])
    meter = apis.StepMeter("cpu", tokens_per_step=64, warmup=1, clock=lambda: next(ticks))
    model = Llama(SMOKE, seed=0)  # tied embedding and head: one tensor, counted once
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    meter.start()
    for step in range(4):
        loss = model(torch.randint(0, 256, (2, 8))).float().mean()
        loss.backward()
        optimizer.step()
        meter.step(loss, model, optimizer)
        optimizer.zero_grad()
    rec = meter.record("x")
    assert rec["step_times_s"] == [0.5, 1.0, 0.25, 0.5]
    assert rec["timing"]["times_s"] == [1.0, 0.25, 0.5] and rec["timing"]["warmup"] == 1
    full = _full_param_bytes()
    assert rec["held_bytes"] == {"params": full, "grads": full, "optimizer": 2 * full}


def test_code_lines_counts_code_only():
    def sample(a, meter):
        """Docstring: not code."""
        # a comment
        b = a + 1

        meter.step(b)  # instrumentation: not the API's code
        return b

    assert apis.code_lines(sample) == 2


def test_each_api_loop_is_counted():
    ns = runpy.run_path(str(SCRIPT), run_name="apis_train")
    counts = {api: apis.code_lines(fn) for api, fn in ns["TRAIN"].items()}
    assert all(n > 5 for n in counts.values()), counts
    # the wrapping, device and sampler lines that Accelerate takes over
    assert counts["native"] > counts["accelerate"], counts


def test_runs_table_uses_the_slowest_rank_per_step():
    def rec(rank, times, losses):
        return {"rank": rank, "api": "a", "strategy": "s", "resolved": {"summary": "x"}, "losses": losses,
                "step_times_s": times, "held_bytes": {"params": 4, "grads": 4, "optimizer": 8},
                "peak_memory_bytes": 16, "memory_kind": "tensors_counted",
                "timing": {"warmup": 1, "items_per_call": 10, "device": "cpu"}}
    ref = [rec(0, [9, 1, 1, 1], [2.0, 1.0, 0.5, 0.25]), rec(1, [9, 2, 1, 3], [2.0, 1.0, 0.5, 0.25])]
    other = [rec(0, [9, 1, 1, 1], [2.0, 1.0, 0.5, 0.3]), rec(1, [9, 1, 1, 1], [2.0, 1.0, 0.5, 0.3])]
    rows = {r["run"]: r for r in apis.runs_table({"ref": ref, "other": other}, reference="ref")}
    assert rows["ref"]["timing"]["times_s"] == [2, 1, 3] and rows["ref"]["step_ms"] == 2000
    assert rows["other"]["max_rel_loss_gap"] == pytest.approx(0.2)
    with pytest.raises(ValueError, match="reference run"):
        apis.runs_table({"other": other}, reference="ref")


# ---------------------------------------------------------------------------------------------------
# fp8 (GPU only): everything around the CUDA function, on the CPU
# ---------------------------------------------------------------------------------------------------

def test_fp8_is_skipped_on_a_cpu_with_one_line():
    reason = apis.fp8_skip_reason("cpu")
    assert reason.startswith("fp8 training skipped") and "8.9" in reason and "\n" not in reason
    with pytest.raises(RuntimeError, match="fp8 training skipped"):
        apis.train_fp8_or_bf16(SMOKE, fp8=True, steps=2, batch=2, seq_len=16, device="cpu")


@pytest.mark.parametrize("capability, missing, expected", [
    ((8, 0), None, "compute capability 8.0"),   # A100: no fp8 Tensor Cores
    ((8, 6), None, "compute capability 8.6"),
    ((8, 9), None, None),                       # L4 / L40S
    ((9, 0), None, None),                       # H100
    ((9, 0), "torchao is not installed", "torchao is not installed"),
])
def test_fp8_skip_reason_by_gpu(capability, missing, expected):
    reason = apis.fp8_skip_reason("cuda", capability=capability, torchao_missing=missing)
    assert (reason is None) if expected is None else (expected in reason and "\n" not in reason)


def test_fp8_converts_the_decoder_linears_and_keeps_the_head():
    from dlo.models.config import TINY_LLAMA

    model = Llama(TINY_LLAMA.replace(num_layers=2), seed=0)
    chosen = [name for name, m in model.named_modules() if apis.fp8_module_filter(m, name)]
    assert len(chosen) == 2 * 7 and not any("lm_head" in n for n in chosen)
    assert not apis.fp8_module_filter(torch.nn.Linear(64, 172), "layers.0.mlp.up_proj")  # 172 % 16 != 0


@pytest.mark.skipif(apis.missing_library("torchao") is not None, reason="torchao not installed")
def test_torchao_converts_the_chosen_linears_on_a_cpu_too():
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    from dlo.models.config import TINY_LLAMA

    model = Llama(TINY_LLAMA.replace(num_layers=1, vocab_size=512), seed=0)
    convert_to_float8_training(model, config=Float8LinearConfig(), module_filter_fn=apis.fp8_module_filter)
    kinds = {name: type(m).__name__ for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    assert sum(k == "Float8Linear" for k in kinds.values()) == 7 and kinds["lm_head"] == "Linear"


def test_fp8_summary_from_records():
    bf16 = {"losses": [5.0, 4.0, 3.0], "timing": {"throughput": 1000.0}}
    fp8 = {"losses": [5.0, 4.1, 3.03], "timing": {"throughput": 1500.0}, "converted_linears": 14}
    s = apis.fp8_summary(bf16, fp8)
    assert s["speedup"] == pytest.approx(1.5) and s["max_loss_gap"] == pytest.approx(0.1)
    assert s["last_loss_gap_rel"] == pytest.approx(0.01) and s["converted_linears"] == 14
    with pytest.raises(ValueError, match="same number of steps"):
        apis.fp8_summary(bf16, {**fp8, "losses": [1.0]})


# ---------------------------------------------------------------------------------------------------
# The apis/fabric_port exercise's checker: its set-ups tell the accumulation mistakes apart
# ---------------------------------------------------------------------------------------------------

def test_the_port_checker_set_ups_tell_each_accumulation_mistake_apart():
    """In a set-up with accumulation, each replayed mistake of the native loop (a step per micro-batch, a loss not
    divided, gradients never zeroed) ends on weights of its own, none equal to the right loop's: so a wrong port
    is named for what it did, and a right one is never taken for a mistake."""
    from dlo.course.checks import apis as port

    seed, accumulate, steps, batch, samples = next(s for s in port.SETUPS if s[1] > 1 and s[2] > 1)
    finals = []
    for kwargs in ({}, {"step_every_micro_batch": True}, {"divide": False}, {"zero": False}):
        model, optimizer, loader = port._setup(seed, batch, samples)
        port.native_loop(model, optimizer, loader, accumulate, steps, **kwargs)
        finals.append(port._weights(model))
    for i in range(len(finals)):
        for j in range(i):
            assert not port._same(finals[i], finals[j]), (i, j)
    model, optimizer, loader = port._setup(seed, batch, samples)
    port.native_loop(model, optimizer, loader, accumulate, steps)
    assert port._accumulation_problem(port._weights(model), (seed, accumulate, steps, batch, samples)).startswith(
        "the weights after the last step differ")
