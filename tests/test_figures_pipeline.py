"""The target Gantt charts of tp_pipeline/pipeline.ipynb are the schedule simulator's: the drawn (stage, micro-batch,
F/B) order on every stage is the simulated one (the order the checkers expect of the schedules the student writes),
and the drawn idle time is the simulator's bubble, which is (p-1)/(m+p-1) for naive, AFAB and 1F1B."""
from __future__ import annotations

from fractions import Fraction

import matplotlib
import pytest

matplotlib.use("Agg")

from dlo.lessons.figures.pipeline import (  # noqa: E402
    drawn_bubble, schedule_gantt, target_and_measured, target_timeline,
)
from dlo.lessons.figures.style import drawn  # noqa: E402
from dlo.parallel.pipeline import analysis as sim  # noqa: E402
from dlo.parallel.pipeline import interleaved_actions, one_f_one_b_actions  # noqa: E402

CASES = [("naive", 2, 1), ("naive", 3, 1), ("naive", 4, 1), ("afab", 2, 4), ("afab", 3, 5), ("afab", 4, 8),
         ("1f1b", 2, 4), ("1f1b", 3, 5), ("1f1b", 3, 4), ("1f1b", 4, 8), ("1f1b", 4, 2), ("1f1b", 5, 7)]


def _drawn_orders(fig, p):
    """Per stage, the (kind, micro-batch, chunk) of the drawn compute boxes, left to right."""
    rows = {r: [] for r in range(p)}
    for d in drawn(fig, "box"):
        tag = d["tag"]
        if isinstance(tag, tuple) and tag[0] in ("F", "B", "W"):
            rows[tag[1]].append((d["x"], (tag[0], tag[2], tag[3])))
    return [[a for _, a in sorted(rows[r], key=lambda t: t[0])] for r in range(p)]


def _drawn_idle(fig, p):
    idle = [Fraction(0)] * p
    for d in drawn(fig, "box"):
        if isinstance(d["tag"], tuple) and d["tag"][0] == "idle":
            idle[d["tag"][1]] += d["tag"][3]
    return idle


def _expected_order(schedule, rank, p, m):
    if schedule in ("naive", "afab"):
        return [("F", i, 0) for i in range(m)] + [("B", i, 0) for i in range(m)]
    return [(k, i, 0) for k, i in one_f_one_b_actions(rank, p, m)]


@pytest.mark.parametrize("schedule, p, m", CASES)
def test_the_drawn_order_is_the_simulated_and_checked_one(schedule, p, m):
    fig = schedule_gantt(schedule, p, m)
    orders = _drawn_orders(fig, p)
    timeline = target_timeline(schedule, p, m)
    for r in range(p):
        simulated = [(e["kind"], e["mb"], e["chunk"]) for e in sorted(timeline[r]["events"], key=lambda e: e["start"])]
        assert orders[r] == simulated == _expected_order(schedule, r, p, m), (schedule, p, m, r)
    matplotlib.pyplot.close(fig)


@pytest.mark.parametrize("schedule, p, m", CASES)
def test_the_drawn_idle_time_is_the_simulators_bubble(schedule, p, m):
    fig = schedule_gantt(schedule, p, m)
    measured = sim.bubble_fraction(target_timeline(schedule, p, m))
    idle = _drawn_idle(fig, p)
    assert idle == measured["idle_s"]
    assert sum(idle) / (measured["span_s"] * p) == measured["bubble"] == drawn_bubble(fig)
    if schedule == "1f1b" and m < p:  # fewer micro-batches than stages: more than the formula's bubble
        assert measured["bubble"] >= Fraction(p - 1, m + p - 1)
    else:
        assert measured["bubble"] == Fraction(p - 1, m + p - 1)
    titles = fig.axes[0].get_title()
    assert f"{p - 1}/{m + p - 1}" in titles and f"{float(measured['bubble']):.0%}" in titles
    matplotlib.pyplot.close(fig)


@pytest.mark.parametrize("p, m, v", [(2, 4, 2), (3, 6, 2), (4, 8, 2)])
def test_interleaved_and_zero_bubble_targets(p, m, v):
    fig = schedule_gantt("interleaved", p, m, v)
    assert _drawn_orders(fig, p) == [interleaved_actions(r, p, m, v) for r in range(p)]
    assert drawn_bubble(fig) == Fraction(p - 1, v * m + p - 1)
    zb = schedule_gantt("zb-h1", p, m)
    assert drawn_bubble(zb) == sim.zb_h1_bubble_theory(p, m)
    assert [[a[:2] for a in row] for row in _drawn_orders(zb, p)] == [sim.zb_h1_actions(r, p, m) for r in range(p)]
    matplotlib.pyplot.close("all")


def test_target_beside_measured_events_and_bad_requests(tmp_path):
    timeline = target_timeline("1f1b", 3, 5)
    as_logged = [[{**e, "start": float(e["start"]) / 1e3, "end": float(e["end"]) / 1e3} for e in row["events"]]
                 for row in timeline]  # a launch's record: seconds per rank
    fig = target_and_measured("1f1b", 3, 5, as_logged, bubble=0.31, path=tmp_path / "t.png")
    assert _drawn_orders(fig, 3) == [[(e["kind"], e["mb"], 0) for e in row["events"]] for row in timeline]
    assert drawn_bubble(fig) == Fraction(2, 7) and "bubble 31%" in fig.axes[1].get_title()
    assert (tmp_path / "t.png").stat().st_size > 0
    matplotlib.pyplot.close(fig)
    with pytest.raises(ValueError, match="whole batch"):
        target_timeline("naive", 4, 2)
    with pytest.raises(ValueError, match="unknown schedule"):
        target_timeline("gpipe", 4, 2)
