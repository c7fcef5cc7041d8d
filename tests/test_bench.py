"""Tests of dlo.measure.bench: warm-up excluded timing, measurements as JSON records, CPU peak memory, environment."""
from __future__ import annotations

import datetime as dt
import json
import statistics
import time

import pytest
import torch

import dlo  # noqa: F401  (before torchvision: prepares its import)
from dlo.measure import bench, verdicts
from dlo.measure import save_json, load_json, table, environment_info, cpu_has_native_bf16, torch_threads


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
    path = save_json({"records": [rec], "env": environment_info("cpu")}, tmp_path / "sub" / "r.json")
    assert path == tmp_path / "sub" / "r.json"
    assert not list(tmp_path.rglob("*.tmp"))
    loaded = load_json(path)
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
    """200 MiB of fresh anonymous pages, every page written, then unmapped: resident memory rises by 200 MiB
    whatever the process did before. (A torch or malloc allocation may reuse pages an earlier test freed but the
    allocator kept resident, and then the RSS does not move: the reason this test does not use one.)"""
    import mmap

    import psutil

    size = 200 * 2**20
    start = psutil.Process().memory_info().rss
    with bench.PeakMemory("cpu") as mem:
        buf = mmap.mmap(-1, size)
        for offset in range(0, size, mmap.PAGESIZE):
            buf[offset] = 1  # touch every page: now resident
        inside = psutil.Process().memory_info().rss
        time.sleep(0.1)  # several sampling periods
        buf.close()  # unmapped: the RSS falls back, only the sampler saw the peak
    assert inside - start >= 190 * 2**20, (inside - start) / 2**20  # the pages really were resident
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
    info = environment_info("cpu")
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
    info = environment_info()
    assert info["device"] == ("cuda" if torch.cuda.is_available() else "cpu")


def test_table_flattens_extra_and_drops_times():
    m = bench.Measurement(name="a", times_s=[1.0, 2.0, 3.0], items_per_call=10, extra={"batch_size": 10, "amp": "bf16"})
    rec = {"name": "b", "throughput": 1.5, "extra": {"batch_size": 20, "name": "ignored"}, "times_s": [1.0]}
    df = table([m, rec])
    assert "extra" not in df.columns and "times_s" not in df.columns
    assert list(df["batch_size"]) == [10, 20]
    assert df.loc[0, "amp"] == "bf16"
    assert list(df["name"]) == ["a", "b"]  # an extra key never overwrites a field
    assert df.loc[0, "throughput"] == pytest.approx(10 / 2.0)
    assert rec["extra"] == {"batch_size": 20, "name": "ignored"}  # the caller's record is not modified
    sub = table([m], columns=["name", "throughput"])
    assert list(sub.columns) == ["name", "throughput"]


def test_cpu_has_native_bf16_is_bool():
    assert isinstance(cpu_has_native_bf16(), bool)


def test_torch_threads_restores():
    old = torch.get_num_threads()
    torch.set_num_threads(2)  # not 1 (what `make test` starts with), so that a missing restore would show
    try:
        with torch_threads(1):
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
        with torch_threads(None):
            assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(old)


def test_synchronize_is_a_noop_on_cpu():
    bench.synchronize("cpu")
    bench.synchronize(None)


# --------------------------------------------------------------------------------------------------
# Warm-up until steady, interleaving, spread, and sentences written from the numbers.
# Every timing below comes from a fake clock: each call *returns* its duration and the timer passes it
# on (``timer=run``), so the tests count calls and check values, never the speed of this machine.
# --------------------------------------------------------------------------------------------------

def run(fn):
    """The fake timer: the call returns how long it 'took'."""
    return fn()


def scripted(durations, log=None, name=None):
    """A call that returns the next of ``durations`` (and appends ``name`` to ``log``)."""
    it = iter(durations)

    def call():
        if log is not None:
            log.append(name)
        return next(it)

    return call


# The baseline of the issue: three warm-up calls, then these five "repeats": a warm-up still going on.
ISSUE_BASELINE = [3.08, 3.70, 2.59, 0.33, 0.26]


def test_fixed_warmup_of_three_calls_times_the_warm_up_itself():
    """What went wrong: with 3 fixed warm-up calls, the slow first calls land in the timed repeats."""
    first_calls = [3.5, 3.6, 3.4] + ISSUE_BASELINE + [0.3] * 10
    times = bench.time_calls(scripted(first_calls), warmup=3, repeats=5, timer=run)
    assert times == ISSUE_BASELINE


def test_warmup_goes_on_until_the_last_calls_agree():
    # a ResNet-18 training step on a 2-core CPU, as timed on such a machine: four slow first calls
    durations = [3.47, 3.69, 2.80, 2.21, 0.43, 0.37, 0.33, 0.40, 0.42, 0.44, 0.44, 0.43, 0.38, 0.32, 0.35, 9.9]
    calls = []
    m = bench.measure("baseline", scripted(durations, calls, "x"), items_per_call=8, timer=run, repeats=5,
                      warmup=bench.Warmup(window=3, tolerance=0.10), track_memory=False, progress=False)
    # last three calls: 0.43 0.37 0.33 (27 %), 0.37 0.33 0.40 (19 %), 0.33 0.40 0.42 (22 %), 0.40 0.42 0.44
    # (9.5 %, within 10 %): steady after 10 calls, and the five repeats come after
    assert m.warmup == 10 and m.steady is True
    assert m.warmup_times_s == durations[:10]
    assert m.times_s == durations[10:15] and len(calls) == 15
    assert verdicts.unsteady_reason(m) is None and "steady" in str(m)


def test_a_slow_plateau_that_passes_the_warm_up_is_caught_by_the_spread_of_the_repeats():
    """Three slow calls that agree look steady; the repeats that follow drop 10x: no ratio from them."""
    m = bench.measure("plateau", scripted([3.5, 3.6, 3.4] + ISSUE_BASELINE), items_per_call=8, timer=run,
                      warmup=bench.Warmup(), repeats=5, track_memory=False, progress=False)
    assert m.steady is True and m.times_s == ISSUE_BASELINE
    assert "spread over 106% of their median" in verdicts.unsteady_reason(m)


def test_warmup_stops_at_its_caps_and_says_not_steady():
    jumpy = bench.measure("jumpy", scripted([1.0, 2.0] * 20), items_per_call=1, timer=run, repeats=2,
                          warmup=bench.Warmup(max_calls=8), track_memory=False, progress=False)
    assert jumpy.warmup == 8 and jumpy.steady is False and "NOT steady" in str(jumpy)
    # the time cap counts the measured seconds of the warm-up calls: 10 + 20 >= 25 after 2 calls
    slow, steady = bench.warm_up(scripted([10.0, 20.0, 10.0, 10.0]), bench.Warmup(max_seconds=25), timer=run)
    assert slow == [10.0, 20.0] and steady is False
    fixed, steady = bench.warm_up(scripted([5.0, 1.0]), 2, timer=run)
    assert fixed == [5.0, 1.0] and steady is None  # a fixed number of calls is not checked


@pytest.mark.parametrize("kwargs, match", [(dict(window=1), "window"), (dict(tolerance=0), "tolerance"),
                                           (dict(max_calls=2), "max_calls"), (dict(max_seconds=0), "max_seconds"),
                                           (dict(min_calls=-1), "min_calls")])
def test_warmup_policy_validates(kwargs, match):
    with pytest.raises(ValueError, match=match):
        bench.Warmup(**kwargs)


def test_median_and_interquartile_range_are_reported():
    m = bench.Measurement(name="m", times_s=[5.0, 1.0, 4.0, 2.0, 3.0], items_per_call=12)
    assert (m.median_s, m.q25_s, m.q75_s) == (3.0, 2.0, 4.0)
    assert m.spread == pytest.approx(2 / 3)
    assert (m.throughput, m.throughput_low, m.throughput_high) == (4.0, 3.0, 6.0)
    rec = m.to_record()
    for key, value in dict(median_s=3.0, q25_s=2.0, q75_s=4.0, min_s=1.0, max_s=5.0, throughput_low=3.0,
                           throughput_high=6.0, repeats=5, steady=None).items():
        assert rec[key] == value, key
    json.dumps(rec)
    one = bench.Measurement(name="one", times_s=[2.0], items_per_call=1)
    assert (one.q25_s, one.q75_s, one.spread) == (2.0, 2.0, 0.0)


def test_candidates_are_timed_interleaved():
    log = []
    ms = bench.measure_interleaved(
        [bench.Candidate("A", scripted([1.0] * 10, log, "A"), 4), bench.Candidate("B", scripted([2.0] * 10, log, "B"), 4)],
        repeats=4, warmup=2, timer=run, track_memory=False, progress=False)
    assert log == ["A", "A", "B", "B"] + ["A", "B", "B", "A"] * 2  # warm-ups, then A B, B A ..., not AAAA BBBB
    assert list(ms) == ["A", "B"]
    assert ms["A"].times_s == [1.0] * 4 and ms["B"].times_s == [2.0] * 4 and ms["A"].warmup == 2
    with pytest.raises(ValueError, match="must differ"):
        bench.measure_interleaved([bench.Candidate("A", lambda: 1.0, 1)] * 2, timer=run, progress=False)
    with pytest.raises(ValueError, match="items_per_call"):
        bench.measure_interleaved({"A": lambda: 1.0}, timer=run, progress=False)


def test_interleaving_shares_a_drift_between_the_candidates():
    """The machine gets 15 % slower halfway through (another job starts). Two identical configurations
    timed AAAAA BBBBB look different; timed A B A B, they are, correctly, not told apart."""
    machine = {"calls": 0}

    def same_work():
        machine["calls"] += 1
        return 1.0 if machine["calls"] <= 10 else 1.15

    opts = dict(items_per_call=1, warmup=0, repeats=10, timer=run, track_memory=False, progress=False)
    a = bench.measure("A", same_work, **opts)
    b = bench.measure("B", same_work, **opts)
    assert a.times_s == [1.0] * 10 and b.times_s == [1.15] * 10  # the drift, all of it blamed on B
    assert verdicts.compare_sentence(a, b).startswith("A is 1.1x faster than B")
    machine["calls"] = 0
    ms = bench.measure_interleaved({"A": same_work, "B": same_work}, **opts)
    assert ms["A"].times_s == ms["B"].times_s == [1.0] * 5 + [1.15] * 5
    assert verdicts.compare_sentence(ms["A"], ms["B"]) == (
        "A against B: no measurable difference on this machine (within the noise: 0.93 vs 0.93 img/s, medians; "
        "98% interval 1x-1x over 10 interleaved rounds, within 5% of 1).")


@pytest.mark.parametrize("ratio, text", [(34.9, "35x"), (3.64, "3.6x"), (0.2, "0.20x"), (0.0123, "0.012x"),
                                         (1.0, "1.0x"), (9.96, "10x"), (123.0, "120x"), (0.999, "1.0x"),
                                         (1.04, "1.04x"), (0.96, "0.96x"), (1.004, "1.0x"), (1.096, "1.1x")])
def test_format_ratio_keeps_two_significant_digits(ratio, text):
    assert verdicts.format_ratio(ratio) == text


def tight(name, seconds, items=8, steady=True):
    """A steady measurement whose repeats are within +-1 % of ``seconds`` (the same jitter in every one of them:
    measurements timed together, round by round)."""
    return bench.Measurement(name=name, times_s=[seconds * f for f in (0.99, 1.0, 1.01, 0.995, 1.005, 1.0, 0.99, 1.01)],
                             items_per_call=items, steady=steady)


def test_compare_sentence_says_what_was_measured():
    fast, slow = tight("no .item()", 8 / 53.8), tight(".item() every step", 8 / 15.0)
    assert verdicts.compare_sentence(fast, slow) == (
        "no .item() is 3.6x faster than .item() every step on this machine (53.8 vs 15 img/s, medians; "
        "beyond the noise: 98% interval 3.59x-3.59x over 8 interleaved rounds).")
    assert verdicts.compare_sentence(slow, fast).startswith(".item() every step is slower than no .item() on this "
                                                         "machine: 0.28x its throughput")
    close_a = bench.Measurement(name="a", times_s=[1.0, 1.1, 1.2, 1.05, 1.15, 1.0, 1.1, 1.2], items_per_call=1)
    close_b = bench.Measurement(name="b", times_s=[0.95, 1.0, 1.1, 1.05, 1.02, 1.1, 1.2, 1.0], items_per_call=1)
    assert verdicts.compare_sentence(close_b, close_a) == (
        "b against a: undecided on this machine (0.966 vs 0.909 img/s, medians; 98% interval 0.913x-1.16x over 8 "
        "interleaved rounds: not clear within the repeats allowed), so no ratio is given.")
    few, other = (bench.Measurement(name=n, times_s=[t] * 5, items_per_call=1) for n, t in (("few", 0.5), ("other", 1)))
    assert "5 and 5 repeats are too few" in verdicts.compare_sentence(few, other)  # 2x in 5 of 5 rounds: p = 1/32
    # records (as read back from results.json) give the same sentence as the measurements
    assert verdicts.compare_sentence(fast.to_record(), slow.to_record()) == verdicts.compare_sentence(fast, slow)


def test_no_ratio_from_a_baseline_that_is_not_steady():
    """The issue's headline: 34.9x over a baseline whose repeats were still warming up."""
    baseline = bench.Measurement(name="baseline", times_s=ISSUE_BASELINE, items_per_call=8, steady=True)
    final = tight("final", 2.59 / 34.9)
    assert verdicts.unsteady_reason(baseline).startswith("the repeats of baseline spread over")
    sentence = verdicts.compare_sentence(final, baseline)
    assert sentence.startswith("No ratio reported for final against baseline: the repeats of baseline spread")
    assert "x faster" not in sentence
    not_settled = tight("warm", 1.0, steady=False)
    assert verdicts.unsteady_reason(not_settled) == "the warm-up of warm did not reach steady timings"
    assert verdicts.compare_sentence(final, not_settled).startswith("No ratio reported")


def test_break_even_sentence():
    eager, compiled = tight("eager", 1.0), tight("compiled", 0.5)
    assert verdicts.break_even_sentence(compiled, eager, 30.0) == (
        "compiled is 2.0x faster than eager: its first call (30.0 s, compilation included) is paid back after "
        "about 60 steps.")
    assert "does not pay off here" in verdicts.break_even_sentence(tight("compiled", 1.0), eager, 30.0)


def contradictions():
    """Results as the old Jour 1 wrote them: two sentences that their own numbers contradict."""
    item_free, item_every = tight("4 steps, .item() every step=False", 4 * 64 / 53.8, 4 * 64), \
        tight("4 steps, .item() every step=True", 4 * 64 / 15.0, 4 * 64)
    baseline = bench.Measurement(name="0 baseline: CPU fp32", times_s=ISSUE_BASELINE, items_per_call=8)
    final = tight("5 + torch.compile", 2.59 / 34.9)
    return {"conclusions": [
        {"kind": "compare", "a": item_free.to_record(), "b": item_every.to_record(), "args": {},
         "sentence": "The `.item()` row shows no difference on a CPU"},
        {"kind": "compare", "a": final.to_record(), "b": baseline.to_record(), "args": {},
         "sentence": "5 + torch.compile is 35x faster than 0 baseline: CPU fp32 on this machine"},
    ]}


def test_check_conclusions_catches_the_two_contradictions(tmp_path):
    problems = verdicts.check_conclusions(contradictions())
    assert len(problems) == 2
    assert "3.6x faster" in problems[0] and "No ratio reported" in problems[1]


def test_conclusions_written_by_conclude_survive_results_json(tmp_path):
    results = {}
    a, b = tight("after", 0.1), tight("before", 0.4)
    said = verdicts.conclude(results, a, b)
    assert said.startswith("after is 4.0x faster than before on this machine")
    verdicts.conclude(results, tight("compiled", 0.2), b, kind="break_even", compile_seconds=12.0)
    verdicts.conclude(results, a, b, a_label="the final configuration", b_label="the baseline")
    loaded = load_json(save_json(results, tmp_path / "results.json"))
    assert [c["kind"] for c in loaded["conclusions"]] == ["compare", "break_even", "compare"]
    assert verdicts.check_conclusions(loaded) == []
    loaded["conclusions"][0]["b"]["times_s"] = [0.1] * 5  # the numbers no longer say "4.0x faster"
    assert len(verdicts.check_conclusions(loaded)) == 1
    with pytest.raises(ValueError, match="unknown conclusion kind"):
        verdicts.conclude(results, a, b, kind="nope")


def _jour1_results():
    from dlo.runtime.paths import ROOT

    return sorted(p for p in (ROOT / "runs").glob("**/jour1/results.json"))


@pytest.mark.parametrize("path", _jour1_results() or [None], ids=str)
def test_jour1_conclusions_match_their_numbers(path):
    """Every sentence Jour 1 wrote about a measured outcome, written again from the numbers it recorded."""
    if path is None:
        pytest.skip("no runs/**/jour1/results.json yet: `make run` writes one")
    results = load_json(path)
    if "conclusions" not in results:
        pytest.skip(f"{path} was written before Jour 1 recorded its conclusions")
    assert results["conclusions"], f"{path}: Jour 1 recorded no conclusion"
    assert verdicts.check_conclusions(results) == []


def test_jour1_states_measured_outcomes_only_through_the_helpers():
    """The old prose ("The `.item()` row shows no difference on a CPU") is gone; Jour 1 records its
    conclusions with verdicts.conclude and checks them before saving results.json."""
    from dlo.runtime.paths import ROOT

    nb = json.loads((ROOT / "Jour1" / "jour1.ipynb").read_text())
    text = "\n".join("".join(c["source"]) for c in nb["cells"])
    assert "shows no difference" not in text
    assert text.count("verdicts.conclude(") >= 4
    assert "verdicts.check_conclusions(results)" in text


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
