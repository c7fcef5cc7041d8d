"""dlo.measure.verdicts.Ladder: a step is kept only if it beats the fastest configuration so far."""
import pytest

from dlo.measure.bench import Measurement
from dlo.measure.verdicts import Ladder


def m(name, seconds, items=10):
    return Measurement(name=name, times_s=[seconds] * 8, items_per_call=items)


def test_keep_only_what_helps():
    lad = Ladder(dtype=None, channels_last=False)
    lad.record("baseline", m("baseline", 1.0))
    lad.record("gpu", None, reason="no GPU")
    lad.record("bf16", m("bf16", 10.0), dtype="bf16")             # slower: dropped
    lad.record("channels_last", m("cl", 0.5), channels_last=True)  # faster: kept
    assert [r["kept"] for r in lad.rows] == [True, False, False, True]
    assert lad.current == {"dtype": None, "channels_last": True}
    assert lad.best()["step"] == "channels_last"
    s = lad.summary()
    # recorded rows were not timed together with the baseline: no headline ratio without final_comparison
    assert s["final_step"] == "channels_last" and s["final_speedup"] is None and s["final_decision"] == "undecided"
    assert s["steps_not_kept"] == ["bf16"] and s["final_status"] == "decided"
    df = lad.table()  # each ratio against the reference it was decided against (the best so far)
    assert list(df["speedup"].round(3)[[2, 3]]) == [0.1, 2.0] and df["speedup_text"][0] == "reference"


def test_not_applicable_needs_a_reason_and_empty_summary_fails():
    lad = Ladder()
    with pytest.raises(ValueError, match="reason"):
        lad.record("gpu")
    with pytest.raises(ValueError, match="no measured step"):
        lad.summary()


# --------------------------------------------------------------------------------------------------
# Keep only what is faster beyond the noise; interleaved comparisons; no headline from an unsteady
# baseline. Timings come from a fake clock (each call returns its duration), never from this machine.
# --------------------------------------------------------------------------------------------------

import json  # noqa: E402

import matplotlib  # noqa: E402

matplotlib.use("Agg")

from dlo.measure import bench, plots, verdicts  # noqa: E402


def run(fn):
    return fn()


def times(name, seconds, items=10, steady=None):
    return Measurement(name=name, times_s=list(seconds), items_per_call=items, steady=steady)


def test_a_step_inside_the_noise_is_undecided_and_not_kept():
    """The issue's bf16 step: 5 % faster at the median, but well inside the baseline's own noise: the rule cannot
    tell from these rounds, so it says "undecided" -- not kept, no ratio, and no "no step beat the baseline"."""
    lad = Ladder(dtype=None)
    lad.record("baseline", times("baseline", [2.0, 2.2, 2.4, 2.1, 2.3, 2.2, 2.1, 2.3]))
    row = lad.record("bf16", times("bf16", [2.0, 2.1, 2.3, 2.15, 2.05, 2.3, 2.2, 2.1]), dtype="bf16")
    assert row["vs_best"] is None and row["ratio_low"] < 1 < row["ratio_high"]
    assert not row["kept"] and row["decision"] == "undecided: not kept"
    assert lad.current == {"dtype": None} and lad.best()["step"] == "baseline"
    s = lad.summary()
    assert s["final_speedup"] is None and s["final_status"] == "undecided" and s["undecided_steps"] == ["bf16"]
    assert s["final_sentence"].startswith("No step was decided faster than the baseline (baseline)")
    assert list(lad.table()["speedup_text"]) == ["reference", "undecided"]
    # 10 % faster in every round (the same noise in both: timed together): kept
    base = [2.0, 2.2, 2.4, 2.1, 2.3, 2.2, 2.1, 2.3]
    row = lad.record("bf16 tight", times("bf16 tight", [t / 1.1 for t in base]), dtype="bf16")
    assert row["kept"] and row["decision"] == "kept" and row["vs_best"] == pytest.approx(1.1)


def test_unsteady_measurements_decide_nothing():
    lad = Ladder()
    lad.record("baseline", times("baseline", [1.0] * 8))
    row = lad.record("compile", times("compile", [0.5] * 8, steady=False))
    assert not row["kept"] and row["decision"] == "not steady: not kept"
    assert row["note"] == "the warm-up of compile did not reach steady timings"
    assert row["vs_best"] is None and list(lad.table()["vs_best_text"]) == ["reference", "unsteady"]
    assert list(lad.table()["flag"]) == ["", "unsteady"] and lad.summary()["final_speedup"] is None


def test_try_step_times_the_candidate_interleaved_with_the_best():
    """The machine is twice slower when the candidate is tried. Against the baseline's old numbers the
    candidate looks slower; timed with the best, A B A B, it is 1.5x faster, and kept."""
    log = []

    def config(name, seconds):
        def call():
            log.append(name)
            return seconds
        return call

    lad = Ladder(layout="nchw")
    opts = dict(items_per_call=10, repeats=7, warmup=1, timer=run, track_memory=False, progress=False)
    lad.try_step("baseline", config("base", 1.0), **opts)
    assert log == ["base"] * 8
    slow_machine_base, slow_machine_new = config("base", 2.0), config("new", 2.0 / 1.5)
    lad._calls["baseline"].call = slow_machine_base  # the same configuration, on a busier machine
    log.clear()
    row = lad.try_step("channels_last", slow_machine_new, config={"layout": "nhwc"}, **opts)
    assert log == ["base", "new"] + ["base", "new", "new", "base"] * 3 + ["base", "new"]  # warm-ups, then A B, B A
    assert row["reference"]["times_s"] == [2.0] * 7 and row["best_step"] == "baseline"
    assert row["kept"] and row["vs_best"] == pytest.approx(1.5) and lad.current == {"layout": "nhwc"}
    assert row["conclusion"].startswith("channels_last is 1.5x faster than baseline on this machine")
    with pytest.raises(ValueError, match="already in the ladder"):
        lad.try_step("channels_last", slow_machine_new, **opts)
    # the headline: baseline and final configuration timed again, together
    log.clear()
    final = lad.final_comparison(repeats=7, warmup=0, timer=run)
    assert log == ["base", "new", "new", "base"] * 3 + ["base", "new"]
    assert final["final"].throughput / final["baseline"].throughput == pytest.approx(1.5)
    s = lad.summary()
    assert s["final_speedup"] == pytest.approx(1.5)
    assert s["final_sentence"].startswith("the final configuration (channels_last) is 1.5x faster than the "
                                          "fp32 baseline on this device (baseline) on this machine")
    assert s["baseline_step"] == "baseline" and "start_step" not in s  # one device: no other comparison


def test_no_headline_speedup_from_an_unsteady_baseline():
    """The issue's 34.9x: the baseline's repeats were 3.08, 3.70, 2.59, 0.33, 0.26 s."""
    lad = Ladder()
    lad.record("0 baseline: CPU fp32", times("0 baseline: CPU fp32", [3.08, 3.70, 2.59, 0.33, 0.26], items=8))
    row = lad.record("5 + torch.compile", times("5 + torch.compile", [0.0742, 0.0741, 0.0743], items=8))
    assert not row["kept"] and row["decision"] == "not steady: not kept"
    s = lad.summary()
    # no ratio can be given: None, not 1.0, and the sentence says why
    assert s["baseline_steady"] is False and s["final_speedup"] is None and s["final_step"] == "0 baseline: CPU fp32"
    assert s["final_sentence"].startswith("No ratio reported: the repeats of 0 baseline: CPU fp32 spread over")
    df = lad.table()
    assert df["speedup"].isna().all()
    assert list(df["speedup_text"]) == ["unsteady"] * 2 and list(df["flag"]) == ["unsteady"] * 2


def test_summary_refuses_a_ratio_when_the_baseline_became_unsteady_later():
    lad = Ladder()
    lad.record("baseline", times("baseline", [1.0] * 8))
    lad.record("fast", times("fast", [0.25] * 8))
    lad.final = {"final": times("fast", [0.25] * 5), "baseline": times("baseline", [3.08, 3.70, 2.59, 0.33, 0.26])}
    s = lad.summary()
    assert s["final_speedup"] is None
    assert s["final_sentence"].startswith("No ratio reported for the final configuration (fast) against the fp32 "
                                          "baseline on this device (baseline)")


def test_table_and_plot_show_the_noise_band_and_the_decision():
    lad = Ladder()
    lad.record("baseline", times("baseline", [0.98, 1.0, 1.02, 0.99, 1.01, 1.0, 0.99, 1.01]))
    lad.record("gpu", None, reason="no GPU")
    lad.record("bf16", times("bf16", [4.9, 5.0, 5.1, 4.95, 5.05, 5.0, 4.95, 5.05]))  # 0.2x: slower
    lad.record("compile", times("compile", [0.49, 0.5, 0.51, 0.5, 0.5, 0.5, 0.49, 0.51]))
    lad.record("noisy", times("noisy", [0.4, 0.6, 0.5, 0.45, 0.55, 0.5, 0.52, 0.48]))  # +-20 %: undecided
    df = lad.table()
    assert list(df["decision"]) == ["baseline", "not applicable", "slower", "kept", "undecided: not kept"]
    assert list(df["speedup_text"]) == ["reference", "", "0.20x", "2.0x", "undecided"]  # never "0x"
    assert df.loc[2, "vs_best_text"] == "0.20x" and list(df["flag"]) == ["", "", "", "", "undecided"]
    assert df.loc[0, "throughput_low"] == pytest.approx(10 / 1.01) and df.loc[0, "throughput_high"] == pytest.approx(10 / 0.99)
    json.dumps(df.to_dict("records"), default=str)
    fig = verdicts.plot_ladder(df[df.applicable], label="step")
    ax = fig.axes[0]
    texts = [t.get_text() for t in ax.texts]
    assert any("0.20x vs best so far" in t and "slower" in t for t in texts)
    assert any("kept" in t for t in texts)
    assert any("(undecided)" in t for t in texts) and not any("noisy" in t and "x vs" in t for t in texts)
    hatches = [p.get_hatch() for p in ax.patches[:4]]
    assert hatches == [None, None, None, "xx"]  # the undecided bar is greyed out and cross-hatched
    assert "undecided or unsteady: no ratio" in [t.get_text() for t in ax.get_legend().get_texts()]
    bars = [c for c in ax.containers if type(c).__name__ == "ErrorbarContainer"]
    assert len(bars) == 1
    segments = bars[0].lines[2][0].get_segments()  # one horizontal error bar per step: low..high
    assert [tuple(round(x, 6) for x in (s[0][0], s[1][0])) for s in segments][0] == (
        round(10 / 1.01, 6), round(10 / 0.99, 6))


# --------------------------------------------------------------------------------------------------
# Re-trying the dropped steps at the batch the sweep chose, and the headline against the fp32 baseline of
# the same device. A fake device: each call returns its own duration (the fake timer `run` reads it), a
# deterministic function of the configuration and the batch, so no wall time is involved.
# --------------------------------------------------------------------------------------------------

import itertools  # noqa: E402

import torch  # noqa: E402

from dlo.measure import verdicts  # noqa: E402
from dlo.measure.bench import Warmup  # noqa: E402
from dlo.measure.verdicts import format_ratio  # noqa: E402
from dlo.measure import save_json, load_json

SMALL, LARGE = 256, 8192
TIGHT = (0.99, 1.0, 1.01, 1.0)  # the repeats of one configuration: a noise band of about 1 %
OPTS = dict(repeats=8, warmup=2, timer=run, track_memory=False, progress=False)


def fake_device(speed, jitter=TIGHT, calls=None):
    """``make_call(config, batch)`` for a device whose throughput is ``speed(config, batch)`` img/s; each call
    returns its duration (batch / throughput, times a repeating jitter). ``calls`` logs (config, batch)."""
    def make_call(config, batch):
        config = dict(config)
        if calls is not None:
            calls.append((config, batch))
        factors = itertools.cycle(jitter)

        def call():
            return batch / speed(config, batch) * next(factors)
        return call
    return make_call


def h100(config, batch):
    """The first H100 run: at batch 256 the step is launch-bound, bf16 gives 1.0x; at 8192 it gives 1.8x.
    channels_last pays only at the small batch; torch.compile pays at neither."""
    if config["device"] == "cpu":
        return 128.0
    speed = 15_000.0 if batch <= SMALL else 36_000.0
    if config.get("channels_last") and batch <= SMALL:
        speed *= 1.3
    if config.get("dtype") == "bf16":
        speed *= 1.0 if batch <= SMALL else 1.8
    return speed


def climb(speed, *, jitter=TIGHT, gpu=True, sweep_batch=LARGE, calls=None, **opts):
    """The notebook's ladder on the fake device, up to the batch step (each step built by make_call)."""
    opts = {**OPTS, **opts}
    make_call = fake_device(speed, jitter, calls)
    lad = Ladder(device="cpu", dtype=None, channels_last=False, batch_size=SMALL)
    dev = "cuda" if gpu else "cpu"

    def step(name, *, batch=SMALL, **change):
        cfg = {**lad.current, **change}
        return lad.try_step(name, make_call(cfg, batch), items_per_call=batch, device=dev, config=change, **opts)

    lad.try_step("0 CPU fp32", make_call(lad.current, SMALL), items_per_call=SMALL, config={"device": "cpu"}, **opts)
    if gpu:
        step("1 GPU fp32", device="cuda")
    else:
        lad.record("1 GPU fp32", reason="no GPU")
    step("2 + bf16", dtype="bf16")
    step("3 + channels_last", channels_last=True)
    step("5 + compile", compile=True)
    step(f"6 batch {sweep_batch}", batch=sweep_batch, batch_size=sweep_batch, compile=False)
    return lad, make_call, dev


def test_a_step_dropped_at_a_small_batch_is_kept_at_the_large_one():
    """The H100 run: bf16 1.0x at batch 256 (dropped), 1.8x at 8192. Re-tried at 8192 it is kept, and the final
    configuration is bf16 at 8192, compared with the GPU fp32 baseline at 256, not with the CPU."""
    lad, make_call, dev = climb(h100)
    assert [r["decision"] for r in lad.rows] == ["baseline", "kept", "not faster beyond noise", "kept",
                                                 "not faster beyond noise", "kept"]
    assert [r["step"] for r in lad.dropped()] == ["2 + bf16", "5 + compile"]  # channels_last is kept: not re-tried
    rows = lad.retry(make_call, device=dev, **OPTS)
    assert [r["step"] for r in rows] == ["retry: 2 + bf16 at batch 8192", "retry: 5 + compile at batch 8192"]
    bf16, comp = rows
    assert bf16["kept"] and bf16["vs_best"] == pytest.approx(1.8) and bf16["batch_size"] == LARGE
    assert bf16["reference"]["name"] == "6 batch 8192"  # timed together with the best configuration at 8192
    assert bf16["retry_why"] == "re-tried at batch 8192: not faster beyond the noise at batch 256"
    assert bf16["conclusion"].startswith(
        "2 + bf16 was not faster beyond the noise at batch 256 (15,000 vs 15,000 img/s, medians; 98% interval ")
    assert bf16["conclusion"].endswith(", within 5% of 1), but 1.8x faster at batch 8192 (64,800 vs 36,000 img/s, "
                                       "medians; beyond the noise: 98% interval 1.76x-1.84x over 8 interleaved rounds).")
    # compile pays at neither batch: dropped again; it was tried on top of bf16 at 8192, the best so far
    assert not comp["kept"] and comp["decision"] == "not faster beyond noise" and comp["dtype"] == "bf16"
    assert comp["reference"]["name"] == "retry: 2 + bf16 at batch 8192"
    assert comp["conclusion"].startswith("5 + compile was not faster beyond the noise at batch 256")
    assert ", and still not faster beyond the noise" in comp["conclusion"]
    assert lad.current == {"device": "cuda", "dtype": "bf16", "channels_last": True, "batch_size": LARGE,
                           "compile": False}
    assert lad.retry(make_call, device=dev, **OPTS) == []  # each step is re-tried once at a batch
    final = lad.final_comparison(**OPTS)
    assert set(final) == {"final", "baseline", "start"}
    s = lad.summary()
    assert s["final_step"] == "retry: 2 + bf16 at batch 8192" and s["final_batch_size"] == LARGE
    assert s["baseline_step"] == "1 GPU fp32"
    assert s["final_speedup"] == pytest.approx(64_800 / 15_000)  # against the GPU in fp32, at batch 256
    assert s["final_sentence"].startswith(
        "the final configuration (retry: 2 + bf16 at batch 8192, batch 8192) is 4.3x faster than the fp32 baseline "
        "on this device (1 GPU fp32, batch 256) on this machine")
    assert s["start_step"] == "0 CPU fp32" and s["final_vs_start"] == pytest.approx(64_800 / 128)  # context only
    assert s["retried"] == {"2 + bf16": "kept", "5 + compile": "not faster beyond noise"}
    df = lad.table()
    # each row's ratio is the one its decision gave, against the reference timed with it
    assert df.loc[df.step == "1 GPU fp32", "speedup_text"].item() == format_ratio(15_000 / 128)
    assert df.loc[df.step == bf16["step"], "speedup_text"].item() == "1.8x"
    assert df.loc[df.step == bf16["step"], "why"].item() == bf16["retry_why"]
    fig = verdicts.plot_ladder(df[df.applicable], label="step")
    assert [p.get_hatch() for p in fig.axes[0].patches[:8]].count("//") == 2  # the retries stand out in the plot


def test_retry_sentences_are_checked_again_from_their_numbers(tmp_path):
    lad, make_call, dev = climb(h100)
    results = {}
    for row in lad.retry(make_call, device=dev, **OPTS):
        first = next(r for r in lad.rows if r["step"] == row["retry_of"])
        said = verdicts.conclude(results, row, row["reference"], kind="retry", first=first,
                                 first_reference=first["reference"], label=row["retry_of"],
                                 first_batch=row["first_batch"], batch=row["batch_size"])
        assert said == row["conclusion"]
    loaded = load_json(save_json(results, tmp_path / "results.json"))
    assert verdicts.check_conclusions(loaded) == []
    loaded["conclusions"][0]["sentence"] = "2 + bf16 does not help on this GPU."
    assert len(verdicts.check_conclusions(loaded)) == 1


def test_on_a_cpu_without_native_bf16_bf16_stays_slower_at_every_batch():
    """A laptop CPU: emulated bf16 is 0.3x at any batch. The headline compares with the CPU baseline."""
    def laptop(config, batch):
        speed = 40.0 if batch <= SMALL else 52.0
        return speed * (0.3 if config.get("dtype") == "bf16" else 1.0)

    lad, make_call, dev = climb(laptop, gpu=False)
    rows = lad.retry(make_call, device=dev, **OPTS)
    bf16 = rows[0]
    assert bf16["decision"] == "slower" and not bf16["kept"]
    assert bf16["conclusion"] == (
        "2 + bf16 was slower at batch 256 (0.30x the throughput: 12 vs 40 img/s, medians; beyond the noise: 98% "
        "interval 0.294x-0.306x over 8 interleaved rounds), and still slower at batch 8192 (0.30x the throughput: "
        "15.6 vs 52 img/s, medians; beyond the noise: 98% interval 0.294x-0.306x over 8 interleaved rounds).")
    lad.final_comparison(**OPTS)
    s = lad.summary()
    assert s["baseline_step"] == "0 CPU fp32" and s["final_step"] == "6 batch 8192"
    assert s["final_speedup"] == pytest.approx(1.3) and "start_step" not in s
    assert s["final_config"]["dtype"] is None


def test_a_gain_below_the_minimum_effect_is_not_kept_on_retry():
    """bf16 2 % faster at the large batch in every round: beyond the noise, but below the 3 % minimum effect."""
    def small_gain(config, batch):
        return h100(config, batch) / (1.8 if config.get("dtype") == "bf16" and batch > SMALL else 1.0) * (
            1.02 if config.get("dtype") == "bf16" and batch > SMALL else 1.0)

    lad, make_call, dev = climb(small_gain, jitter=(1.0,))
    bf16 = lad.retry(make_call, device=dev, **OPTS)[0]
    assert bf16["ratio_low"] > 1 and bf16["decision"] == "not faster beyond noise"
    assert bf16["vs_best"] == pytest.approx(1.02)
    assert not bf16["kept"] and lad.current["dtype"] is None
    lad.final_comparison(**OPTS)
    s = lad.summary()
    assert s["final_step"] == "6 batch 8192" and s["final_speedup"] == pytest.approx(36_000 / 15_000)


def test_a_step_kept_at_the_ladder_batch_is_not_re_tried_and_one_kept_then_undone_is():
    calls = []
    lad, make_call, dev = climb(h100, calls=calls)
    calls.clear()
    lad.retry(make_call, device=dev, **OPTS)
    retried = [cfg for cfg, batch in calls]
    assert all(batch == LARGE for _, batch in calls)
    assert not any(cfg["channels_last"] is False for cfg in retried)  # channels_last stays in every retry
    # compile kept at the ladder's batch, then left out by the batch step (the sweep runs eager): re-tried
    def compile_pays(config, batch):
        return h100(config, batch) * (1.5 if config.get("compile") and batch <= SMALL else 1.0)

    lad, make_call, dev = climb(compile_pays)
    assert lad.rows[4]["kept"] and lad.current["compile"] is False
    rows = lad.retry(make_call, device=dev, **OPTS)
    assert [r["retry_of"] for r in rows] == ["2 + bf16", "5 + compile"]
    assert rows[1]["retry_why"] == "re-tried at batch 8192: kept, then left out by a later step at batch 256"


def test_retry_skips_with_a_reason_and_records_an_out_of_memory_failure():
    lad, make_call, dev = climb(h100)

    def make_or_fail(config, batch):
        call = make_call(config, batch)
        if config.get("dtype") == "bf16" and not config.get("compile"):
            def oom():
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
            return oom
        return call

    rows = lad.retry(make_or_fail, device=dev, skip={"5 + compile": "recompiling takes minutes here"}, **OPTS)
    assert [r["decision"] for r in rows] == ["failed", "not re-tried"]
    assert rows[0]["reason"].startswith("re-tried at batch 8192: not faster beyond the noise at batch 256; it failed: "
                                        "OutOfMemoryError: CUDA out of memory")
    assert rows[1]["reason"] == "not re-tried at batch 8192: recompiling takes minutes here"
    assert lad.best()["step"] == "6 batch 8192"
    assert list(lad.table()["why"])[-1] == rows[1]["reason"]


def test_retry_needs_a_batch():
    lad = Ladder(dtype=None)
    lad.record("baseline", times("baseline", [1.0] * 3))
    with pytest.raises(ValueError, match="needs the batch"):
        lad.retry(lambda config, batch: (lambda: 1.0))


def test_no_headline_ratio_when_the_final_comparison_is_not_steady():
    """The GPU baseline's warm-up never settles during the final comparison: final_speedup is None, and the
    sentence says why."""
    lad, make_call, dev = climb(h100)
    lad.retry(make_call, device=dev, **OPTS)
    base = lad._calls["1 GPU fp32"].call
    wild = itertools.cycle([1.0, 3.0, 0.5, 2.0])
    lad._calls["1 GPU fp32"].call = lambda: base() * next(wild)  # the machine got busy
    lad.final_comparison(**{**OPTS, "warmup": Warmup(max_calls=6)})
    s = lad.summary()
    assert s["final_speedup"] is None
    assert s["final_sentence"].startswith("No ratio reported for the final configuration (retry: 2 + bf16 at batch "
                                          "8192, batch 8192) against the fp32 baseline on this device (1 GPU fp32, "
                                          "batch 256): the warm-up of 1 GPU fp32 did not reach steady timings")


def test_when_the_sweep_batch_was_not_kept_retries_are_timed_against_the_best_at_its_own_batch():
    """The batch step gave nothing beyond the noise (fp32 as fast at 8192 as at 256), so the best configuration
    stays at 256; bf16 re-tried at 8192 is timed against it (images per second compare across batches)."""
    def flat(config, batch):
        return 128.0 if config["device"] == "cpu" else 15_000.0 * (
            1.8 if config.get("dtype") == "bf16" and batch > SMALL else 1.0)

    lad, make_call, dev = climb(flat)
    assert lad.rows[-1]["decision"] == "not faster beyond noise" and lad.best()["step"] == "1 GPU fp32"
    bf16 = lad.retry(make_call, LARGE, device=dev, **OPTS)[0]
    assert bf16["reference"]["name"] == "1 GPU fp32" and bf16["kept"]
    assert bf16["conclusion"].endswith("at batch 8192 (27,000 vs 15,000 img/s, medians; beyond the noise: 98% "
                                       "interval 1.76x-1.84x over 8 interleaved rounds; the best configuration so far, "
                                       "timed with it, ran at batch 256).")
    lad.final_comparison(**OPTS)
    s = lad.summary()
    assert s["final_batch_size"] == LARGE and s["final_speedup"] == pytest.approx(1.8)


def test_jour1_re_tries_at_the_chosen_batch_and_its_rehearsal_reaches_the_re_try():
    """The notebook calls Ladder.retry after the sweep and states each retry through conclude(kind="retry"); the
    dry profile (the full profile rehearsed on a CPU in CI) sweeps only batches other than the ladder's, so that
    the re-try always runs there; the full profile re-tries torch.compile too."""
    import ast

    from dlo.course.notebooks import profile_settings
    from dlo.runtime.paths import ROOT

    cells = json.loads((ROOT / "Jour1" / "jour1.ipynb").read_text())["cells"]
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    assert code.index("largest_batch(try_batch") < code.index("lad.retry(make_call") < code.index("lad.final_comparison(")
    # the sentences about the re-tries are written by the lesson's helper, through conclude(kind="retry")
    assert "lesson.retry_report(" in code and 'kind="retry"' in (ROOT / "lib/dlo/lessons/jour1.py").read_text()
    statement = next(node for node in ast.parse(code).body if isinstance(node, ast.Assign)
                     and any(getattr(t, "id", None) == "PROFILES" for t in node.targets))
    scope: dict = {}
    exec(compile(ast.Module([statement], []), "PROFILES", "exec"), scope)
    dry, full = profile_settings(scope["PROFILES"], "dry"), profile_settings(scope["PROFILES"], "full")
    assert dry["sweep"] and dry["batch_size"] not in dry["sweep"]
    assert full["retry_compile"] is True
