"""Tests of dlo.measure.bench: warm-up excluded timing, measurements as JSON records, CPU peak memory, environment."""
from __future__ import annotations

import datetime as dt
import json
import statistics
import time

import pytest
import torch

import dlo  # noqa: F401  (before torchvision: prepares its import)
from dlo.measure import bench


# --------------------------------------------------------------------------------------------------
# time_calls
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("warmup, repeats", [(0, 1), (1, 5), (3, 2)])
def test_time_calls_counts_warmup_and_repeats(warmup, repeats):
    calls = []
    times = bench.time_calls(lambda: calls.append(1), warmup=warmup, repeats=repeats)
    assert len(calls) == warmup + repeats
    assert len(times) == repeats
    assert all(isinstance(t, float) and t >= 0 for t in times)


def test_time_calls_discards_the_warmup_calls():
    """The first (slow) call is a warm-up: none of the timed calls may include it."""
    calls = {"n": 0}

    def fn():
        calls["n"] += 1
        if calls["n"] == 1:
            time.sleep(0.2)

    times = bench.time_calls(fn, warmup=1, repeats=3)
    assert calls["n"] == 4
    assert max(times) < 0.1, times


def test_time_calls_without_warmup_times_the_first_call():
    calls = {"n": 0}

    def fn():
        calls["n"] += 1
        if calls["n"] == 1:
            time.sleep(0.1)

    times = bench.time_calls(fn, warmup=0, repeats=2)
    assert times[0] >= 0.09
    assert times[1] < 0.09


def test_time_calls_measures_elapsed_time():
    times = bench.time_calls(lambda: time.sleep(0.02), warmup=0, repeats=2)
    assert all(0.015 <= t < 1.0 for t in times), times


@pytest.mark.parametrize("kwargs", [dict(repeats=0), dict(repeats=-1), dict(warmup=-1)])
def test_time_calls_rejects_bad_counts(kwargs):
    calls = []
    with pytest.raises(ValueError) as exc:
        bench.time_calls(lambda: calls.append(1), **kwargs)
    assert ("repeats" if "repeats" in kwargs else "warmup") in str(exc.value)
    assert calls == []  # refused before running anything


def test_time_calls_with_progress_bar_still_counts(capsys):
    calls = []
    times = bench.time_calls(lambda: calls.append(1), warmup=1, repeats=2, progress="bar")
    assert len(calls) == 3 and len(times) == 2


# --------------------------------------------------------------------------------------------------
# measure / measure_steps / records
# --------------------------------------------------------------------------------------------------

def test_measure_throughput_is_items_over_median():
    m = bench.measure("sleepy", lambda: time.sleep(0.005), items_per_call=32, warmup=1, repeats=5,
                      track_memory=False, progress=False, note="x")
    assert len(m.times_s) == 5
    assert m.median_s == statistics.median(m.times_s)
    assert m.throughput == pytest.approx(32 / statistics.median(m.times_s), rel=1e-12)
    assert m.peak_memory_bytes is None and m.memory_kind is None
    assert m.extra == {"note": "x"}
    assert m.warmup == 1 and m.device == "cpu"
    assert "sleepy" in str(m) and "img/s" in str(m)


def test_measure_tracks_cpu_memory_by_default():
    m = bench.measure("noop", lambda: None, items_per_call=1, repeats=2, progress=False)
    assert m.memory_kind == "cpu_rss_peak"
    assert isinstance(m.peak_memory_bytes, int) and m.peak_memory_bytes > 0
    assert "MiB" in str(m)


def test_record_is_json_serialisable_and_round_trips(tmp_path):
    m = bench.measure("rt", lambda: None, items_per_call=8, warmup=0, repeats=3, progress=False,
                      batch_size=8, amp="bf16")
    rec = m.to_record()
    json.dumps(rec)  # plain JSON, without save_json's default=str fallback
    for key in ("name", "times_s", "items_per_call", "median_s", "throughput", "repeats", "extra", "device"):
        assert key in rec
    assert rec["repeats"] == 3
    assert rec["throughput"] == m.throughput
    path = bench.save_json({"records": [rec], "env": bench.environment_info("cpu")}, tmp_path / "sub" / "r.json")
    assert path == tmp_path / "sub" / "r.json"
    assert not list(tmp_path.rglob("*.tmp"))
    loaded = bench.load_json(path)
    assert loaded["records"] == [rec]
    assert loaded["env"]["torch"] == torch.__version__


def test_measure_steps_cycles_batches_and_counts_images():
    batches = [(torch.full((4, 3), float(i)), torch.zeros(4, dtype=torch.long)) for i in range(3)]
    seen = []
    m = bench.measure_steps("steps", lambda x, y: seen.append(int(x[0, 0])), batches, warmup=1, repeats=5,
                            track_memory=False, progress=False)
    assert seen == [0, 1, 2, 0, 1, 2]
    assert m.items_per_call == 4
    assert m.extra["batch_size"] == 4
    assert m.throughput == pytest.approx(4 / m.median_s)


def test_measure_steps_extra_passes_through():
    batches = [(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long))]
    m = bench.measure_steps("s", lambda x, y: None, batches, repeats=1, progress=False, track_memory=False,
                            amp="none")
    assert m.extra == {"batch_size": 2, "amp": "none"}


def test_measure_steps_rejects_empty_batches():
    with pytest.raises(ValueError, match="at least one"):
        bench.measure_steps("empty", lambda x, y: None, [])


# --------------------------------------------------------------------------------------------------
# PeakMemory
# --------------------------------------------------------------------------------------------------

def test_peak_memory_cpu_sees_a_200mb_allocation():
    import psutil

    start = psutil.Process().memory_info().rss
    with bench.PeakMemory("cpu") as mem:
        x = torch.ones(50_000_000)  # 200 MB, every page written
        time.sleep(0.1)  # several sampling periods
        del x
    assert mem.kind == "cpu_rss_peak"
    assert mem.peak_bytes - start >= 150 * 2**20, (mem.peak_bytes - start) / 2**20
    assert mem._thread is not None and not mem._thread.is_alive()  # sampler stopped at exit


def test_peak_memory_cpu_small_block_has_a_peak():
    with bench.PeakMemory("cpu") as mem:
        pass
    assert mem.peak_bytes > 0


# --------------------------------------------------------------------------------------------------
# environment, table, bf16
# --------------------------------------------------------------------------------------------------

def test_environment_info_keys():
    info = bench.environment_info("cpu")
    for key in ("torch", "device", "cpu_native_bf16", "date", "python", "torchvision", "dlo", "cpu_cores",
                "torch_threads", "cpu_capability", "gpu"):
        assert key in info, key
    assert info["torch"] == torch.__version__
    assert info["device"] == "cpu"
    assert info["gpu"] is None
    assert isinstance(info["cpu_native_bf16"], bool)
    assert info["dlo"] == dlo.__version__
    assert dt.datetime.fromisoformat(info["date"]).tzinfo is not None
    json.dumps(info)


def test_environment_info_default_device():
    info = bench.environment_info()
    assert info["device"] == ("cuda" if torch.cuda.is_available() else "cpu")


def test_table_flattens_extra_and_drops_times():
    m = bench.Measurement(name="a", times_s=[1.0, 2.0, 3.0], items_per_call=10, extra={"batch_size": 10, "amp": "bf16"})
    rec = {"name": "b", "throughput": 1.5, "extra": {"batch_size": 20, "name": "ignored"}, "times_s": [1.0]}
    df = bench.table([m, rec])
    assert "extra" not in df.columns and "times_s" not in df.columns
    assert list(df["batch_size"]) == [10, 20]
    assert df.loc[0, "amp"] == "bf16"
    assert list(df["name"]) == ["a", "b"]  # an extra key never overwrites a field
    assert df.loc[0, "throughput"] == pytest.approx(10 / 2.0)
    assert rec["extra"] == {"batch_size": 20, "name": "ignored"}  # the caller's record is not modified
    sub = bench.table([m], columns=["name", "throughput"])
    assert list(sub.columns) == ["name", "throughput"]


def test_cpu_has_native_bf16_is_bool():
    assert isinstance(bench.cpu_has_native_bf16(), bool)


def test_torch_threads_restores():
    old = torch.get_num_threads()
    with bench.torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == old
    with bench.torch_threads(None):
        assert torch.get_num_threads() == old


def test_synchronize_is_a_noop_on_cpu():
    bench.synchronize("cpu")
    bench.synchronize(None)

# --------------------------------------------------------------------------------------------------
# MFU against the peak of the precision the step computes in (dlo.measure.flops)
# --------------------------------------------------------------------------------------------------

def test_mfu_divides_by_the_peak_of_the_step_dtype():
    from dlo.measure import flops as F

    name = "NVIDIA H100 80GB HBM3"
    fp32, bf16 = F.gpu_peak(name, dtype=torch.float32), F.gpu_peak(name, dtype=torch.bfloat16)
    assert (fp32.peak_flops, bf16.peak_flops) == (67e12, 989e12)
    assert fp32.dtype == "fp32" and fp32.name == "H100 SXM"
    assert F.gpu_peak(name) is F.GPU_PEAKS["H100"]  # no dtype: the table's entry (16-bit peak)
    # 6.7e12 useful FLOP/s in fp32 is 10 % of the fp32 peak, not 0.68 % of the bf16 one
    assert F.mfu(1000, 6.7e9, fp32) == pytest.approx(0.10)
    assert F.mfu(1000, 6.7e9, F.GPU_PEAKS["H100"], dtype=torch.float32) == pytest.approx(0.10)
    assert F.mfu(1000, 6.7e9, F.GPU_PEAKS["H100"], dtype="bf16") == pytest.approx(6.7e12 / 989e12)
    assert F.gpu_peak(name, dtype="tf32").peak_flops == 494e12
    assert F.GPU_PEAKS["V100"].peak_flops == 125e12 and F.GPU_PEAKS["V100"].peak(torch.float16) == 125e12
    with pytest.raises(ValueError, match="no bf16"):
        F.gpu_peak("Tesla V100-SXM2-32GB", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="no tf32 peak"):
        F.GPU_PEAKS["V100"].peak("tf32")
    with pytest.raises(ValueError, match="no peak is quoted for dtype"):
        F.GPU_PEAKS["H100"].peak(torch.float64)
    with pytest.raises(ValueError, match="already a number"):
        F.mfu(1000, 1e9, 1e15, dtype=torch.float32)
