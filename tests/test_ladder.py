"""dlo.measure.bench.Ladder: a step is kept only if it beats the fastest configuration so far."""
import pytest

from dlo.measure.bench import Ladder, Measurement


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
