"""The target Gantt chart of a pipeline schedule, drawn from the schedule simulator.

One row per stage (rank), one box per forward (F) or backward (B) of a micro-batch, at the time
:func:`dlo.parallel.pipeline.analysis.simulate_schedule` gives it (fixed costs: a forward 1 unit, a backward 2,
free transfers), in the order the schedules of ``pipeline_train.py`` run them (the order the checkers expect).
Idle time inside the step is drawn as hatched grey boxes: the bubble, whose fraction the title gives next to
``(p-1)/(m+p-1)``. ``tests/test_figures_pipeline.py`` compares the drawn order and idle time with the simulator.

:func:`target_and_measured` puts the target above a measured Gantt chart of the same schedule (the event logs
a launch of ``pipeline_train.py`` returns), on two separate time axes: simulated units above, milliseconds below.
"""
from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import Any, Sequence

import matplotlib.pyplot as plt

from dlo.lessons.figures.style import PALETTE, box, canvas, label, legend, save
from dlo.parallel.pipeline import analysis as sim

#: The schedules a target can be drawn for; "naive" is AFAB with one micro-batch (the whole batch).
TARGETS = ("naive", "afab", "1f1b", "interleaved", "zb-h1")
NAMES = {"naive": "naive (one batch)", "afab": "GPipe / AFAB", "1f1b": "1F1B", "interleaved": "interleaved 1F1B",
         "zb-h1": "ZB-H1"}
#: The colours of the measured Gantt charts (dlo.parallel.pipeline.gantt), so that a target and a run read alike.
COLOURS = {"F": "#4c72b0", "B": "#55a868", "W": "#dd8452"}
ROW = 1.0  # data units between two stages' rows


def target_timeline(schedule: str, num_stages: int, micro_batches: int, virtual: int = 1, *,
                    forward: Any = 1, backward: Any = 2) -> list[dict]:
    """The simulated timeline a figure draws: ``simulate_schedule`` with a forward of ``forward`` units and a
    backward of ``backward`` (a backward costs about two forwards); "naive" is AFAB with ``micro_batches=1``."""
    if schedule not in TARGETS:
        raise ValueError(f"unknown schedule {schedule!r}: choose one of {', '.join(TARGETS)}")
    if schedule == "naive":
        if micro_batches != 1:
            raise ValueError(f"the naive schedule runs the whole batch at once: micro_batches=1, not {micro_batches}")
        schedule = "afab"
    if schedule == "zb-h1":  # a split backward: B (input gradient) and W (weight gradient), half of it each
        return sim.simulate_schedule(schedule, num_stages, micro_batches, forward=forward,
                                     backward=Fraction(backward) / 2, weight=Fraction(backward) / 2)
    return sim.simulate_schedule(schedule, num_stages, micro_batches, virtual, forward=forward,
                                 backward=Fraction(backward), weight=0)


def theory_text(schedule: str, num_stages: int, micro_batches: int, virtual: int = 1) -> str:
    """The closed form of the bubble fraction, with this pipeline's numbers: ``(p-1)/(m+p-1) = 3/11``."""
    p, m = num_stages, micro_batches
    if schedule == "interleaved":
        return f"(p−1)/(v·m+p−1) = {p - 1}/{virtual * m + p - 1}"
    if schedule == "zb-h1":
        return "ZB-H1: idle (p−1)(F+B−W) per stage"
    return f"(p−1)/(m+p−1) = {p - 1}/{m + p - 1}"


def draw_timeline(ax: plt.Axes, timeline: Sequence[dict], *, y0: float = 0.0) -> dict[str, Any]:
    """Draw ``timeline`` (rank 0 on top) on ``ax`` with the style's boxes; each compute box is tagged
    ``("F"|"B"|"W", rank, micro-batch, chunk)`` and each idle gap inside the step ``("idle", rank, start, length)``.
    Returns the span and the idle time per rank (in the timeline's units)."""
    p = len(timeline)
    events = [row["events"] for row in timeline]
    t0 = min(e["start"] for evs in events for e in evs)
    t1 = max(e["end"] for evs in events for e in evs)
    idle = []
    for r, evs in enumerate(events):
        y = y0 + (p - 1 - r) * ROW
        label(ax, -0.3, y + 0.4, f"stage {r}", ha="right", fontsize=8)
        clock, gaps = t0, Fraction(0)
        chunked = any(e.get("chunk", 0) for e in evs)
        for e in sorted(evs, key=lambda e: e["start"]):
            if e["start"] > clock:
                box(ax, float(clock - t0), y, float(e["start"] - clock), 0.8, color=PALETTE["idle"], edge="#BBBBBB",
                    hatch="///", tag=("idle", r, e["start"] - t0, e["start"] - clock))
                gaps += e["start"] - clock
            text = f"{e['mb']}" + ("abc"[int(e.get("chunk", 0)) % 3] if chunked else "")
            box(ax, float(e["start"] - t0), y, float(e["end"] - e["start"]), 0.8, text, color=COLOURS[e["kind"]],
                text_color="white", fontsize=7, tag=(e["kind"], r, e["mb"], int(e.get("chunk", 0))))
            clock = e["end"]
        if t1 > clock:
            box(ax, float(clock - t0), y, float(t1 - clock), 0.8, color=PALETTE["idle"], edge="#BBBBBB",
                hatch="///", tag=("idle", r, clock - t0, t1 - clock))
            gaps += t1 - clock
        idle.append(gaps)
    return {"span": t1 - t0, "idle": idle}


def _bubble(idle: Sequence[Fraction], span: Fraction) -> Fraction:
    return sum(idle, Fraction(0)) / (span * len(idle))


def schedule_gantt(schedule: str, num_stages: int, micro_batches: int, virtual: int = 1, *,
                   path: str | Path | None = None) -> plt.Figure:
    """The target Gantt chart of ``schedule`` on ``num_stages`` stages with ``micro_batches`` micro-batches (see
    the module): boxes in the simulated order, the bubble hatched, its fraction in the title."""
    timeline = target_timeline(schedule, num_stages, micro_batches, virtual)
    span = max(e["end"] for row in timeline for e in row["events"])
    fig, ax = canvas(float(span) + 1.0, num_stages * ROW + 1.0, inches_per_unit=0.32)
    ax.set_xlim(-2.2, float(span) + 0.2)
    out = draw_timeline(ax, timeline, y0=0.6)
    bubble = _bubble(out["idle"], out["span"])
    m = "1 (the whole batch)" if schedule == "naive" else str(micro_batches)
    ax.set_title(f"target: {NAMES[schedule]}, p = {num_stages} stages, m = {m}"
                 + (f", v = {virtual}" if schedule == "interleaved" else "")
                 + f"\nbubble (hatched) = {float(bubble):.0%} of the step; {theory_text(schedule, num_stages, micro_batches, virtual)}",
                 fontsize=10)
    label(ax, 0, 0.25, f"time → (forward = 1 unit, backward = 2; step = {float(out['span']):g} units)", fontsize=7)
    legend(ax, _legend(timeline), loc="upper left", fontsize=7)
    ax.legend_.set_bbox_to_anchor((1.0, 1.0))
    fig._dlo_bubble = bubble
    return save(fig, path)


def _legend(timeline: Sequence[dict]) -> dict[str, str]:
    split = any(e["kind"] == "W" for row in timeline for e in row["events"])
    out = {"forward (F)": COLOURS["F"], "B: input gradient" if split else "backward (B)": COLOURS["B"]}
    if split:
        out["W: weight gradient"] = COLOURS["W"]
    out["idle: the bubble"] = PALETTE["idle"]
    return out


def target_and_measured(schedule: str, num_stages: int, micro_batches: int, measured_events: Sequence[Sequence],
                        *, virtual: int = 1, bubble: float | None = None,
                        path: str | Path | None = None) -> plt.Figure:
    """The target Gantt chart above the measured one (one rank's event list per row of ``measured_events``, as a
    launch's record holds them); ``bubble``: the measured bubble fraction, given in the lower title."""
    timeline = target_timeline(schedule, num_stages, micro_batches, virtual)
    span = float(max(e["end"] for row in timeline for e in row["events"]))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 1.1 * num_stages + 3.2), constrained_layout=True,
                                      gridspec_kw={"height_ratios": [1, 1.25]})
    fig._dlo_drawn = []
    top.set_xlim(-2.2, span + 0.2)
    top.set_ylim(0, num_stages * ROW + 0.2)
    top.axis("off")
    out = draw_timeline(top, timeline, y0=0.1)
    target = _bubble(out["idle"], out["span"])
    top.set_title(f"target ({NAMES[schedule]}, p={num_stages}, m={micro_batches}, simulated units): bubble "
                  f"{float(target):.0%} = {theory_text(schedule, num_stages, micro_batches, virtual)}", fontsize=9)
    said = "" if bubble is None else f": bubble {bubble:.0%}"
    sim.gantt([{"events": e} for e in measured_events], ax=bottom,
              title=f"measured on this machine (ms){said}")
    fig._dlo_bubble = target
    return save(fig, path)


def drawn_bubble(fig: plt.Figure) -> Fraction:
    """The bubble fraction the drawn target shows (sum of the hatched boxes over stages × span)."""
    return fig._dlo_bubble
