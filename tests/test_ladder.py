"""dlo.measure.verdicts.Ladder: a step is kept only if it beats the fastest configuration so far."""
import pytest

from dlo.measure.bench import Measurement
from dlo.measure.verdicts import Ladder


def m(name, seconds, items=10):
    return Measurement(name=name, times_s=[seconds] * 3, items_per_call=items)


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
    assert s["final_step"] == "channels_last" and s["final_speedup"] == pytest.approx(2.0)
    assert s["steps_not_kept"] == ["bf16"]
    df = lad.table()
    assert list(df["speedup"].round(3)[[0, 2, 3]]) == [1.0, 0.1, 2.0]


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

from dlo.measure import bench, plots  # noqa: E402


def run(fn):
    return fn()


def times(name, seconds, items=10, steady=None):
    return Measurement(name=name, times_s=list(seconds), items_per_call=items, steady=steady)


def test_a_step_inside_the_noise_is_not_kept():
    """The issue's bf16 step: 5 % faster at the median, but well inside the baseline's own noise."""
    lad = Ladder(dtype=None)
    lad.record("baseline", times("baseline", [2.0, 2.2, 2.4, 2.1, 2.3]))
    row = lad.record("bf16", times("bf16", [2.0, 2.1, 2.3, 2.15, 2.05]), dtype="bf16")  # median 2.1 vs 2.2
    assert row["vs_best"] == pytest.approx(2.2 / 2.1)
    assert not row["kept"] and row["decision"] == "not faster beyond noise"
    assert lad.current == {"dtype": None} and lad.best()["step"] == "baseline"
    assert lad.summary()["final_speedup"] == 1.0
    # a step whose slow quartile still beats the baseline's fast quartile (2.1 s) is beyond the noise: kept
    row = lad.record("bf16 tight", times("bf16 tight", [1.89, 1.9, 1.91, 1.9, 1.9]), dtype="bf16")
    assert row["kept"] and row["decision"] == "kept"


def test_unsteady_measurements_decide_nothing():
    lad = Ladder()
    lad.record("baseline", times("baseline", [1.0] * 5))
    row = lad.record("compile", times("compile", [0.5] * 5, steady=False))
    assert not row["kept"] and row["decision"] == "not steady: not kept"
    assert row["note"] == "the warm-up of compile did not reach steady timings"
    assert row["vs_best"] is None and list(lad.table()["vs_best_text"]) == ["", "no ratio: not steady"]


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
    opts = dict(items_per_call=10, repeats=3, warmup=1, timer=run, track_memory=False, progress=False)
    lad.try_step("baseline", config("base", 1.0), **opts)
    assert log == ["base"] * 4
    slow_machine_base, slow_machine_new = config("base", 2.0), config("new", 2.0 / 1.5)
    lad._calls["baseline"].call = slow_machine_base  # the same configuration, on a busier machine
    log.clear()
    row = lad.try_step("channels_last", slow_machine_new, config={"layout": "nhwc"}, **opts)
    assert log == ["base", "new"] + ["base", "new"] * 3  # warm-ups, then interleaved
    assert row["reference"]["times_s"] == [2.0] * 3 and row["best_step"] == "baseline"
    assert row["kept"] and row["vs_best"] == pytest.approx(1.5) and lad.current == {"layout": "nhwc"}
    assert row["conclusion"].startswith("channels_last is 1.5x faster than baseline on this machine")
    with pytest.raises(ValueError, match="already in the ladder"):
        lad.try_step("channels_last", slow_machine_new, **opts)
    # the headline: baseline and final configuration timed again, together
    log.clear()
    final = lad.final_comparison(repeats=2, warmup=0, timer=run)
    assert log == ["base", "new"] * 2
    assert final["final"].throughput / final["baseline"].throughput == pytest.approx(1.5)
    s = lad.summary()
    assert s["final_speedup"] == pytest.approx(1.5)
    assert s["final_sentence"].startswith("the final configuration (channels_last) is 1.5x faster than the "
                                          "baseline (baseline) on this machine")


def test_no_headline_speedup_from_an_unsteady_baseline():
    """The issue's 34.9x: the baseline's repeats were 3.08, 3.70, 2.59, 0.33, 0.26 s."""
    lad = Ladder()
    lad.record("0 baseline: CPU fp32", times("0 baseline: CPU fp32", [3.08, 3.70, 2.59, 0.33, 0.26], items=8))
    row = lad.record("5 + torch.compile", times("5 + torch.compile", [0.0742, 0.0741, 0.0743], items=8))
    assert not row["kept"] and row["decision"] == "not steady: not kept"
    s = lad.summary()
    assert s["baseline_steady"] is False and s["final_speedup"] == 1.0 and s["final_step"] == "0 baseline: CPU fp32"
    df = lad.table()
    assert df["speedup"].isna().all()
    assert list(df["speedup_text"]) == ["no ratio: baseline not steady"] * 2


def test_summary_refuses_a_ratio_when_the_baseline_became_unsteady_later():
    lad = Ladder()
    lad.record("baseline", times("baseline", [1.0] * 5))
    lad.record("fast", times("fast", [0.25] * 5))
    lad.final = {"final": times("fast", [0.25] * 5), "baseline": times("baseline", [3.08, 3.70, 2.59, 0.33, 0.26])}
    s = lad.summary()
    assert s["final_speedup"] is None
    assert s["final_sentence"].startswith("No ratio reported for the final configuration (fast) against the baseline")


def test_table_and_plot_show_the_noise_band_and_the_decision():
    lad = Ladder()
    lad.record("baseline", times("baseline", [0.98, 1.0, 1.02, 0.99, 1.01]))
    lad.record("gpu", None, reason="no GPU")
    lad.record("bf16", times("bf16", [4.9, 5.0, 5.1, 4.95, 5.05]))  # 0.2x: slower
    lad.record("compile", times("compile", [0.49, 0.5, 0.51, 0.5, 0.5]))
    df = lad.table()
    assert list(df["decision"]) == ["baseline", "not applicable", "slower", "kept"]
    assert list(df["speedup_text"]) == ["1.0x", "", "0.20x", "2.0x"]  # never "0x"
    assert df.loc[2, "vs_best_text"] == "0.20x"
    assert df.loc[0, "throughput_low"] == pytest.approx(10 / 1.01) and df.loc[0, "throughput_high"] == pytest.approx(10 / 0.99)
    json.dumps(df.to_dict("records"), default=str)
    fig = plots.ladder(df[df.applicable], label="step")
    ax = fig.axes[0]
    texts = [t.get_text() for t in ax.texts]
    assert any("0.20x vs baseline" in t and "slower" in t for t in texts)
    assert any("kept" in t for t in texts)
    bars = [c for c in ax.containers if type(c).__name__ == "ErrorbarContainer"]
    assert len(bars) == 1
    segments = bars[0].lines[2][0].get_segments()  # one horizontal error bar per step: low..high
    assert [tuple(round(x, 6) for x in (s[0][0], s[1][0])) for s in segments][0] == (
        round(10 / 1.01, 6), round(10 / 0.99, 6))
