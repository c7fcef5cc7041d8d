"""The schedule simulator of dlo.parallel.pipeline.analysis: exact timelines with fixed costs, against the
closed forms (AFAB and 1F1B ``(p-1)/(m+p-1)``, interleaved ``(p-1)/(v*m+p-1)``, ZB-H1
``(p-1)(F+B-W) / (m(F+B+W) + (p-1)(F+B-W))``), with every dependency checked here independently of the
simulator, ZB-H1's memory against 1F1B's, and the simulated orders against the order the real Pipe runs
(each rank's real schedule function on a DryRunPipe: the Pipe's own code, no process group).

Times are fractions, so every comparison is exact: no tolerance, no clock.
"""
from __future__ import annotations

import itertools
from fractions import Fraction

import matplotlib
import pytest

from dlo.parallel.p2p_replay import DryRunPipe
from dlo.parallel.pipeline import bubble_fraction, bubble_theory, one_f_one_b_actions, train_step
from dlo.parallel.pipeline.analysis import (gantt, peak_in_flight, simulate, simulate_schedule, simulated_orders,
                                            zb_h1_actions, zb_h1_bubble_theory)

matplotlib.use("Agg")

STAGES = range(2, 7)
COSTS = [(1, 1, 1), (1, 2, 1), (2, 3, 1), (3, 1, 1), (1, 1, Fraction(1, 3))]  # (F, B, W)


def _ms(p: int) -> tuple[int, int, int]:
    return p, 2 * p, 3 * p


def _span(timeline) -> Fraction:
    return bubble_fraction(timeline)["span_s"]


# ----------------------------------------------------------------------------------------------------
# An independent check of a timeline: dependencies, costs, order, no overlap, earliest starts
# ----------------------------------------------------------------------------------------------------
def check_timeline(timeline, orders, p: int, v: int, costs: tuple) -> None:
    f, b, w = map(Fraction, costs)
    split = any(e["kind"] == "W" for r in timeline for e in r["events"])
    duration = {"F": f / v, "B": (b if split else b + w) / v, "W": w / v}
    at = {}
    for r, rank in enumerate(timeline):
        evs = rank["events"]
        assert [(e["kind"], e["mb"], e["chunk"]) for e in evs] == [tuple(a) for a in orders[r]], f"rank {r}: order"
        for prev, e in zip([None, *evs], evs):
            assert e["rank"] == r and e["end"] - e["start"] == duration[e["kind"]]
            if prev is not None:
                assert e["start"] >= prev["end"], f"rank {r}: two actions at once"
            at[(e["kind"], e["mb"], e["chunk"] * p + r)] = e
    last = p * v - 1
    for (kind, mb, s), e in at.items():
        need = []
        if kind == "F" and s > 0:
            need.append(at[("F", mb, s - 1)])
        if kind == "B":
            need.append(at[("F", mb, s)])
            if s < last:
                need.append(at[("B", mb, s + 1)])
        if kind == "W":
            need.append(at[("B", mb, s)])
        for d in need:
            assert e["start"] >= d["end"], f"{kind} of micro-batch {mb} on stage {s} starts before {d}"
    for r, rank in enumerate(timeline):  # earliest feasible: each action starts when its rank and inputs allow
        for prev, e in zip([None, *rank["events"]], rank["events"]):
            s = e["chunk"] * p + r
            deps = {"F": [("F", e["mb"], s - 1)] if s > 0 else [],
                    "B": [("F", e["mb"], s)] + ([("B", e["mb"], s + 1)] if s < last else []),
                    "W": [("B", e["mb"], s)]}[e["kind"]]
            ready = max([prev["end"] if prev else Fraction(0), *(at[d]["end"] for d in deps)])
            assert e["start"] == ready, f"rank {r}: {e['kind']} of micro-batch {e['mb']} could start at {ready}"


@pytest.mark.parametrize("schedule", ["afab", "1f1b", "interleaved", "zb-h1"])
def test_every_dependency_holds_in_every_timeline(schedule):
    for p in STAGES:
        ms = _ms(p) if schedule == "interleaved" else range(1, 3 * p + 1)
        vs = (2, 3) if schedule == "interleaved" else (1,)
        for m, v, costs in itertools.product(ms, vs, COSTS):
            orders = simulated_orders(schedule, p, m, v)
            timeline = simulate(orders, virtual=v, forward=costs[0], backward=costs[1], weight=costs[2])
            check_timeline(timeline, orders, p, v, costs)


# ----------------------------------------------------------------------------------------------------
# Bubbles against their closed forms
# ----------------------------------------------------------------------------------------------------
def test_afab_and_1f1b_bubble_equals_theory():
    """Any m (also m < p), any costs: the idle fraction is (p-1)/(m+p-1), bubble_theory's."""
    for p in STAGES:
        for m, costs in itertools.product(range(1, 3 * p + 1), COSTS + [(1, 2, 0)]):
            for schedule in ("afab", "1f1b"):
                tl = simulate_schedule(schedule, p, m, forward=costs[0], backward=costs[1], weight=costs[2])
                assert bubble_fraction(tl)["bubble"] == Fraction(p - 1, m + p - 1), (schedule, p, m, costs)
                assert float(bubble_fraction(tl)["bubble"]) == pytest.approx(bubble_theory(p, m))
                assert _span(tl) == (m + p - 1) * sum(map(Fraction, costs))


def test_interleaved_bubble_equals_theory():
    for p in STAGES:
        for m, v, costs in itertools.product(_ms(p), (2, 3), COSTS):
            tl = simulate_schedule("interleaved", p, m, v, forward=costs[0], backward=costs[1], weight=costs[2])
            assert bubble_fraction(tl)["bubble"] == Fraction(p - 1, v * m + p - 1), (p, m, v, costs)
            assert float(bubble_fraction(tl)["bubble"]) == pytest.approx(bubble_theory(p, m, v))


def test_zb_h1_bubble_equals_its_closed_form_unit_costs():
    """F = B = W: (p-1)/(3m+p-1); each rank idles p-1 units, a third of 1F1B's 3(p-1)."""
    for p in STAGES:
        for m in _ms(p):
            zb, one = simulate_schedule("zb-h1", p, m), simulate_schedule("1f1b", p, m)
            assert bubble_fraction(zb)["bubble"] == Fraction(p - 1, 3 * m + p - 1) == zb_h1_bubble_theory(p, m)
            assert _span(zb) == 3 * m + (p - 1) and _span(one) == 3 * m + 3 * (p - 1)
            assert bubble_fraction(zb)["idle_s"] == [p - 1] * p and bubble_fraction(one)["idle_s"] == [3 * (p - 1)] * p


def test_zb_h1_closed_form_holds_when_w_is_no_longer_than_f_and_b():
    """(p-1)(F+B-W) idle per rank for W <= min(F, B), on a grid of costs; beyond, the closed form refuses
    and the simulated step is longer than it would say."""
    for f, b, w in itertools.product((1, 2, 3), repeat=3):
        for p in (2, 3, 5):
            for m in _ms(p):
                tl = simulate_schedule("zb-h1", p, m, forward=f, backward=b, weight=w)
                formula = m * (f + b + w) + (p - 1) * (f + b - w)
                if w <= min(f, b):
                    assert _span(tl) == formula, (f, b, w, p, m)
                    assert bubble_fraction(tl)["bubble"] == zb_h1_bubble_theory(p, m, forward=f, backward=b, weight=w)
                else:
                    assert _span(tl) > formula, (f, b, w, p, m)
                    with pytest.raises(ValueError, match=r"W <= min\(F, B\)"):
                        zb_h1_bubble_theory(p, m, forward=f, backward=b, weight=w)
    with pytest.raises(ValueError, match="m >= p"):
        zb_h1_bubble_theory(4, 3)


def test_deferring_w_is_what_shrinks_the_bubble():
    """The same split backward with each W right after its B: a larger bubble than ZB-H1's."""
    for p in (3, 4, 6):
        m = 2 * p
        eager = [[(k, i, 0) for kind, i in one_f_one_b_actions(r, p, m)
                  for k in ((kind,) if kind == "F" else ("B", "W"))] for r in range(p)]
        assert bubble_fraction(simulate(eager))["bubble"] > zb_h1_bubble_theory(p, m)


# ----------------------------------------------------------------------------------------------------
# Memory: ZB-H1 holds what 1F1B holds
# ----------------------------------------------------------------------------------------------------
def _held(order, release: str) -> int:
    """Peak micro-batches held, counted on the order itself (F takes one, ``release`` gives it back)."""
    held = peak = 0
    for kind, _, *_ in order:
        held += 1 if kind == "F" else -1 if kind == release else 0
        peak = max(peak, held)
    return peak


def test_zb_h1_holds_no_more_micro_batches_than_1f1b():
    for p in STAGES:
        for m in _ms(p):
            one, zb = simulated_orders("1f1b", p, m), simulated_orders("zb-h1", p, m)
            # F..B (what B needs): rank by rank the same as 1F1B, p - r
            assert [_held(o, "B") for o in zb] == [_held(o, "B") for o in one] == [p - r for r in range(p)]
            # F..W (what W still needs): p on every rank, 1F1B's peak (its rank 0), never more
            assert [_held(o, "W") for o in zb] == [p] * p
            assert max(_held(o, "W") for o in zb) == max(_held(o, "B") for o in one)
            # the same counts from the simulated timelines
            assert peak_in_flight(simulate_schedule("zb-h1", p, m), until="W") == [p] * p
            assert peak_in_flight(simulate_schedule("zb-h1", p, m)) == peak_in_flight(simulate_schedule("1f1b", p, m))
            # ZB-H1 is 1F1B's order with the backward split: drop the W's, the F/B order is 1F1B's
            for r in range(p):
                assert [a for a in zb_h1_actions(r, p, m) if a[0] != "W"] == one_f_one_b_actions(r, p, m)


# ----------------------------------------------------------------------------------------------------
# The simulated orders are those the real code runs
# ----------------------------------------------------------------------------------------------------
def _real_order(schedule: str, p: int, m: int, v: int = 1) -> list[list[tuple[str, int, int]]]:
    """Each rank's compute events when the real schedule function drives the real Pipe (no processes:
    DryRunPipe posts no transfer and computes zeros, the order is the Pipe's own)."""
    out = []
    for rank in range(p):
        stats = train_step(DryRunPipe(rank, p, m, v), schedule)
        out.append([(e.kind, e.mb, e.chunk) for e in stats.events])
    return out


def test_simulated_orders_are_the_ones_the_pipe_runs():
    """tests/test_pipeline.py also checks, on 2 and 4 gloo processes, that the Pipe's 1F1B events follow
    one_f_one_b_actions; here every pipeline size, micro-batch count and chunk count."""
    for p in STAGES:
        for m in sorted({1, p - 1, p, p + 1, 2 * p}):
            for schedule in ("afab", "1f1b"):
                real = _real_order(schedule, p, m)
                assert real == simulated_orders(schedule, p, m), (schedule, p, m)
                timeline = simulate_schedule(schedule, p, m)
                assert [[(e["kind"], e["mb"], e["chunk"]) for e in r["events"]] for r in timeline] == real
        for v in (2, 3):
            assert _real_order("interleaved", p, p, v) == simulated_orders("interleaved", p, p, v)
            assert _real_order("interleaved", p, 2 * p, v) == simulated_orders("interleaved", p, 2 * p, v)


# ----------------------------------------------------------------------------------------------------
# Bad orders, and the Gantt of a simulated timeline
# ----------------------------------------------------------------------------------------------------
def test_bad_orders_say_what_is_wrong():
    with pytest.raises(ValueError, match=r"rank 1: each of the 2 micro-batches x 1 chunk\(s\) must run F and B"):
        simulate([[("F", 0), ("F", 1), ("B", 0), ("B", 1)], [("F", 0), ("B", 0), ("F", 1)]])
    with pytest.raises(ValueError, match="wait for each other forever: rank 0 at B of micro-batch 0"):
        simulate([[("B", 0), ("F", 0)], [("F", 0), ("B", 0)]])
    with pytest.raises(ValueError, match="unknown schedule 'zb-h2'"):
        simulated_orders("zb-h2", 4, 8)
    with pytest.raises(ValueError, match="virtual=2 is for 'interleaved' only"):
        simulated_orders("zb-h1", 4, 8, 2)


def test_gantt_of_a_simulated_timeline():
    import matplotlib.pyplot as plt

    tl = simulate_schedule("zb-h1", 4, 8)
    fig = gantt(tl, title="ZB-H1", time_unit="one forward = 1")
    ax = fig.axes[0]
    assert len(ax.patches) == 4 * 8 * 3  # one box per F, B and W
    assert ax.get_xlabel() == "time (one forward = 1)"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["forward", "B: input gradient", "W: weight gradient"]
    assert max(p.get_x() + p.get_width() for p in ax.patches) == pytest.approx(float(_span(tl)))
    plt.close(fig)
    fig = gantt(simulate_schedule("1f1b", 2, 2), time_unit="unit")
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["forward", "backward"]
    plt.close(fig)
