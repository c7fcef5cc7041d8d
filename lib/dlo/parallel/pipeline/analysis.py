"""What a pipeline step's event logs say: every rank's stats gathered on rank 0, the measured bubble against
:func:`bubble_theory`, and a Gantt chart of the schedule. Also an exact **simulator** of schedule timelines
with fixed costs (:func:`simulate`, :func:`simulate_schedule`), which draws the same Gantt charts as the
measured logs, including the zero-bubble schedule ZB-H1 (:func:`zb_h1_actions`) that splits each backward
into B (input gradient) and W (weight gradient)."""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import torch.distributed as dist

from dlo.parallel.pipeline.pipe import Event, StepStats
from dlo.parallel.pipeline.schedules import interleaved_actions, one_f_one_b_actions


# ----------------------------------------------------------------------------------------------------
# Analysis: gather, bubble, Gantt
# ----------------------------------------------------------------------------------------------------
def gather_stats(stats: StepStats) -> list[dict] | None:
    """Every rank's stats as dicts on rank 0 (None elsewhere); the stats themselves without a process group."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [stats.as_dict()]
    out: list[Any] | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(stats.as_dict(), out, dst=0)
    return out


def bubble_theory(num_stages: int, micro_batches: int, virtual: int = 1) -> float:
    """Idle fraction of an ideal pipeline (equal stages, free transfers): ``(p-1) / (v*m + p-1)``."""
    return (num_stages - 1) / (virtual * micro_batches + num_stages - 1)


def _events(per_rank: Sequence[dict | StepStats]) -> list[list[dict]]:
    out = []
    for r in per_rank:
        evs = r.events if isinstance(r, StepStats) else r["events"]
        out.append([dataclasses.asdict(e) if isinstance(e, Event) else dict(e) for e in evs])
    return out


def bubble_fraction(per_rank: Sequence[dict | StepStats]) -> dict[str, Any]:
    """Measured idle fraction: each rank's idle time inside the step's span (first start to last end over all
    ranks) divided by the span, averaged over ranks. Also returns per-rank busy / idle seconds."""
    events = _events(per_rank)
    starts = [e["start"] for evs in events for e in evs]
    ends = [e["end"] for evs in events for e in evs]
    if not starts:
        raise ValueError("no events to measure: run a schedule first")
    span = max(ends) - min(starts)
    busy = [sum(e["end"] - e["start"] for e in evs) for evs in events]
    idle = [span - b for b in busy]
    return {"span_s": span, "busy_s": busy, "idle_s": idle, "bubble": sum(idle) / (span * len(events))}


def gantt(per_rank: Sequence[dict | StepStats], *, title: str = "Pipeline schedule", ax=None, path=None,
          time_unit: str = "ms"):
    """One row per rank, one box per compute event: forwards blue, backwards green, weight gradients (W, in a
    split backward) orange, labelled with the micro-batch (and chunk letter for interleaved schedules).
    ``time_unit="ms"``: the events' times are seconds (a measured log), drawn in milliseconds; any other
    text: the times are drawn as they are and the axis says ``time_unit`` (a simulated timeline). Returns
    the figure."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    events = _events(per_rank)
    scale = 1e3 if time_unit == "ms" else 1.0
    t0 = min(float(e["start"]) for evs in events for e in evs)
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(10, 0.5 * len(events) + 1.2))
    colors = {"F": ["#4c72b0", "#8fb0e0", "#27466e"], "B": ["#55a868", "#9ad3a8", "#2f6b3d"],
              "W": ["#dd8452", "#f0b98f", "#a0522d"]}
    for r, evs in enumerate(events):
        if not evs:
            continue
        chunked = any(x.get("chunk", 0) for x in evs)
        starts = [(float(e["start"]) - t0) * scale for e in evs]
        widths = [(float(e["end"]) - float(e["start"])) * scale for e in evs]
        cols = [colors[e["kind"]][int(e.get("chunk", 0)) % 3] for e in evs]
        ax.barh([r] * len(evs), widths, left=starts, color=cols, edgecolor="white", height=0.8)  # one call per rank
        for e, start, w in zip(evs, starts, widths):
            label = f"{e['mb']}" + ("abc"[int(e.get("chunk", 0)) % 3] if chunked else "")
            ax.text(start + w / 2, r, label, ha="center", va="center", fontsize=7, color="white")
    ax.set_yticks(range(len(events)), [f"rank {r}" for r in range(len(events))])
    ax.invert_yaxis()
    ax.set_xlabel("time since the step began (ms)" if time_unit == "ms" else f"time ({time_unit})")
    ax.set_title(title)
    split = any(e["kind"] == "W" for evs in events for e in evs)
    handles = [Patch(color=colors["F"][0], label="forward"),
               Patch(color=colors["B"][0], label="B: input gradient" if split else "backward")]
    if split:
        handles.append(Patch(color=colors["W"][0], label="W: weight gradient"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig = fig or ax.figure
    if path is not None:
        fig.savefig(path, dpi=120, bbox_inches="tight")
    return fig


# ----------------------------------------------------------------------------------------------------
# Simulated timelines: fixed costs, free transfers, every action as early as its inputs allow
# ----------------------------------------------------------------------------------------------------
SIMULATED_SCHEDULES = ("afab", "1f1b", "interleaved", "zb-h1")


def zb_h1_actions(rank: int, num_stages: int, micro_batches: int) -> list[tuple[str, int]]:
    """The ZB-H1 order of one rank (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", section 2.1).

    It is 1F1B's order (:func:`~dlo.parallel.pipeline.schedules.one_f_one_b_actions`) with each backward
    split in two: ``("B", i)``, the gradient with respect to micro-batch ``i``'s *input*, which the previous
    stage waits for, and ``("W", i)``, the gradient with respect to the stage's *weights*, which nobody waits
    for. Rank ``r`` runs the W of micro-batch ``i`` right after the B of micro-batch ``i + r`` (the last ``r``
    W's at the very end). In 1F1B rank ``r`` holds ``p - r`` micro-batches between their F and their B; here
    every rank holds ``p`` between F and W: no rank more than 1F1B's rank 0 (which delays nothing), and a
    later rank, whose B's come back sooner, has W's at hand to fill the wait for the last gradients."""
    actions: list[tuple[str, int]] = []
    for kind, mb in one_f_one_b_actions(rank, num_stages, micro_batches):
        actions.append((kind, mb))
        if kind == "B" and mb >= rank:
            actions.append(("W", mb - rank))
    actions += [("W", mb) for mb in range(max(micro_batches - rank, 0), micro_batches)]
    return actions


def simulated_orders(schedule: str, num_stages: int, micro_batches: int, virtual: int = 1
                     ) -> list[list[tuple[str, int, int]]]:
    """Each rank's order of ``(kind, micro-batch, chunk)`` for one of :data:`SIMULATED_SCHEDULES`: the action
    lists the real schedules run (:func:`one_f_one_b_actions`, :func:`interleaved_actions`; AFAB's all forwards
    then all backwards) and ZB-H1's (:func:`zb_h1_actions`). ``virtual`` chunks per rank: interleaved only."""
    p, m, v = num_stages, micro_batches, virtual
    if schedule not in SIMULATED_SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}: choose one of {', '.join(SIMULATED_SCHEDULES)}")
    if schedule != "interleaved" and v != 1:
        raise ValueError(f"{schedule} runs one chunk per rank: virtual={v} is for 'interleaved' only")
    if schedule == "interleaved":
        return [interleaved_actions(r, p, m, v) for r in range(p)]
    if schedule == "afab":
        return [[("F", i, 0) for i in range(m)] + [("B", i, 0) for i in range(m)] for _ in range(p)]
    actions = one_f_one_b_actions if schedule == "1f1b" else zb_h1_actions
    return [[(kind, mb, 0) for kind, mb in actions(r, p, m)] for r in range(p)]


def _dependencies(kind: str, mb: int, stage: int, num_virtual: int) -> list[tuple[str, int, int]]:
    """What ``kind`` of micro-batch ``mb`` on (virtual) stage ``stage`` waits for, as (kind, mb, stage)."""
    if kind == "F":
        return [("F", mb, stage - 1)] if stage > 0 else []
    if kind == "B":  # its own forward (the loss on the last stage), and the output's gradient from the next stage
        return [("F", mb, stage)] + ([("B", mb, stage + 1)] if stage < num_virtual - 1 else [])
    return [("B", mb, stage)]  # W: the gradient of the stage's output, which B received


def _check_orders(orders: list[list[tuple[str, int, int]]], virtual: int) -> tuple[int, bool]:
    """Micro-batch count and whether the backward is split (W actions); each rank must run every action once."""
    split = any(a[0] == "W" for order in orders for a in order)
    kinds = ("F", "B", "W") if split else ("F", "B")
    m = sum(a[0] == "F" for a in orders[0]) // virtual if orders else 0
    want = sorted((k, i, c) for k in kinds for i in range(m) for c in range(virtual))
    for r, order in enumerate(orders):
        if sorted(order) != want:
            seen = sorted(order)
            extra = [a for a in set(seen) if seen.count(a) > 1 or a not in want]
            missing = sorted(set(want) - set(seen))
            raise ValueError(f"rank {r}: each of the {m} micro-batches x {virtual} chunk(s) must run "
                             f"{' and '.join(kinds)} exactly once (missing {missing[:4]}, unexpected or repeated "
                             f"{sorted(extra)[:4]})")
    return m, split


def simulate(orders: Sequence[Sequence[tuple]], *, virtual: int = 1, forward: Any = 1, backward: Any = 1,
             weight: Any = 1) -> list[dict]:
    """The timeline of per-rank orders with fixed costs and free transfers, every action as early as possible.

    ``orders[r]``: rank ``r``'s actions in the order it runs them, ``(kind, micro-batch)`` or ``(kind,
    micro-batch, chunk)``; chunk ``c`` of rank ``r`` is virtual stage ``c * p + r``. ``kind`` is "F", "B"
    or "W". Costs are those of one micro-batch through one rank's whole share of the model (a chunk costs
    ``1/virtual`` of it): ``forward`` for F; with W actions (a split backward) ``backward`` for B (input
    gradient) and ``weight`` for W (weight gradient); without, one "B" event of ``backward + weight``.

    An action starts when its rank has finished the previous action of its order and its inputs exist:
    F of micro-batch i on stage s after F of i on stage s-1; B of i on s after F of i on s and B of i on
    s+1; W of i on s after B of i on s. Times are exact fractions (:class:`fractions.Fraction`). Returns
    ``[{"rank": r, "events": [event dicts]}, ...]`` in the format of :class:`StepStats.as_dict`'s events,
    for :func:`gantt` (``time_unit=...``), :func:`bubble_fraction` and :func:`peak_in_flight`. Raises
    ValueError if an action is missing or repeated, or if the orders wait for each other forever."""
    p = len(orders)
    acts = [[(str(a[0]), int(a[1]), int(a[2]) if len(a) > 2 else 0) for a in order] for order in orders]
    _, split = _check_orders(acts, virtual)
    cost = {"F": Fraction(forward), "B": Fraction(backward) + (0 if split else Fraction(weight)),
            "W": Fraction(weight)}
    cost = {k: c / virtual for k, c in cost.items()}
    num_virtual = p * virtual
    end: dict[tuple[str, int, int], Fraction] = {}
    free = [Fraction(0)] * p
    nxt = [0] * p
    events: list[list[dict]] = [[] for _ in range(p)]
    while any(nxt[r] < len(acts[r]) for r in range(p)):
        moved = False
        for r in range(p):
            while nxt[r] < len(acts[r]):
                kind, mb, chunk = acts[r][nxt[r]]
                deps = _dependencies(kind, mb, chunk * p + r, num_virtual)
                if any(d not in end for d in deps):
                    break
                start = max([free[r], *(end[d] for d in deps)])
                free[r] = end[(kind, mb, chunk * p + r)] = start + cost[kind]
                events[r].append({"rank": r, "mb": mb, "kind": kind, "start": start, "end": free[r], "chunk": chunk})
                nxt[r] += 1
                moved = True
        if not moved:
            waits = []
            for r in range(p):
                if nxt[r] < len(acts[r]):
                    kind, mb, chunk = acts[r][nxt[r]]
                    need = [f"{k} of micro-batch {i} on stage {s}"
                            for k, i, s in _dependencies(kind, mb, chunk * p + r, num_virtual) if (k, i, s) not in end]
                    waits.append(f"rank {r} at {kind} of micro-batch {mb} (chunk {chunk}) waits for {', '.join(need)}")
            raise ValueError("these orders wait for each other forever: " + "; ".join(waits))
    return [{"rank": r, "events": evs} for r, evs in enumerate(events)]


def simulate_schedule(schedule: str, num_stages: int, micro_batches: int, virtual: int = 1, *, forward: Any = 1,
                      backward: Any = 1, weight: Any = 1) -> list[dict]:
    """:func:`simulate` of :func:`simulated_orders`: e.g. ``simulate_schedule("zb-h1", 4, 8)``, unit costs."""
    return simulate(simulated_orders(schedule, num_stages, micro_batches, virtual), virtual=virtual,
                    forward=forward, backward=backward, weight=weight)


def peak_in_flight(per_rank: Sequence[dict | StepStats], *, until: str = "B") -> list[int]:
    """Per rank, the most micro-batches (micro-batch chunks for interleaved) held at once: from the end of
    their F to the end of their B (``until="B"``: the activations B needs) or of their W (``until="W"``: W
    still needs the stage's inputs and output gradients; a rank with no W events frees at B)."""
    if until not in ("B", "W"):
        raise ValueError(f"until must be 'B' or 'W', not {until!r}")
    out = []
    for evs in _events(per_rank):
        release = until if any(e["kind"] == until for e in evs) else "B"
        held = peak = 0
        for e in sorted(evs, key=lambda e: e["start"]):
            held += 1 if e["kind"] == "F" else -1 if e["kind"] == release else 0
            peak = max(peak, held)
        out.append(peak)
    return out


def zb_h1_bubble_theory(num_stages: int, micro_batches: int, *, forward: Any = 1, backward: Any = 1,
                        weight: Any = 1) -> Fraction:
    """ZB-H1's idle fraction, exact: ``(p-1)(F+B-W) / (m(F+B+W) + (p-1)(F+B-W))``; with F = B = W,
    ``(p-1) / (3m+p-1)``: a third of 1F1B's idle time ``(p-1)(F+B+W)``.

    Where it comes from (the span of :func:`simulate_schedule` ``("zb-h1", ...)``). The last rank starts
    at ``(p-1)F`` (its first input crosses ``p-1`` stages) and then never waits; when its B of the last
    micro-batch ``m-1`` ends, all its work is done but ``p`` W's (``p-1`` delayed, and that of ``m-1``):
    at ``t = (p-1)F + m(F+B+W) - pW``. That gradient then crosses ranks ``p-2, ..., 0``, one B each, every
    rank being free when it arrives (when ``W <= F``: a delayed W is over by then), and rank 0 ends with
    its W of ``m-1``: at ``t + (p-1)B + W``. Rank ``r`` ends ``(p-1-r)B + (r+1)W`` after ``t``, no later
    than rank 0 when ``W <= B``. Span: ``(p-1)F + m(F+B+W) - pW + (p-1)B + W = m(F+B+W) + (p-1)(F+B-W)``;
    every rank computes ``m(F+B+W)``, so each idles ``(p-1)(F+B-W)``. The paper's ZB-H2 reaches
    ``(p-1)(F+B-2W)`` (zero for F = B = W) by holding up to ``2p-1`` micro-batches; not simulated here.

    Valid for ``m >= p``, ``W <= F`` and ``W <= B`` (the tests compare it with the simulation, exactly, for
    p = 2..6, m in {p, 2p, 3p} and a grid of costs); outside, ask :func:`simulate_schedule`."""
    p, m = num_stages, micro_batches
    f, b, w = Fraction(forward), Fraction(backward), Fraction(weight)
    if m < p or w > f or w > b:
        raise ValueError(f"the closed form holds for m >= p and W <= min(F, B) (got p={p}, m={m}, F={f}, B={b}, "
                         f"W={w}): use simulate_schedule('zb-h1', ...) instead")
    idle = (p - 1) * (f + b - w)
    return idle / (m * (f + b + w) + idle)
