"""What a pipeline step's event logs say: every rank's stats gathered on rank 0, the measured bubble against
:func:`bubble_theory`, and a Gantt chart of the schedule."""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch.distributed as dist

from dlo.parallel.pipeline.pipe import Event, StepStats


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


def gantt(per_rank: Sequence[dict | StepStats], *, title: str = "Pipeline schedule", ax=None, path=None):
    """One row per rank, one box per compute event: forwards blue, backwards green, labelled with the micro-batch
    (and chunk letter for interleaved schedules). Returns the figure."""
    import matplotlib.pyplot as plt

    events = _events(per_rank)
    t0 = min(e["start"] for evs in events for e in evs)
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(10, 0.5 * len(events) + 1.2))
    colors = {"F": ["#4c72b0", "#8fb0e0", "#27466e"], "B": ["#55a868", "#9ad3a8", "#2f6b3d"]}
    for r, evs in enumerate(events):
        for e in evs:
            chunk = int(e.get("chunk", 0))
            col = colors[e["kind"]][chunk % 3]
            w = (e["end"] - e["start"]) * 1e3
            ax.barh(r, w, left=(e["start"] - t0) * 1e3, color=col, edgecolor="white", height=0.8)
            label = f"{e['mb']}" + ("abc"[chunk % 3] if any(x.get("chunk", 0) for x in evs) else "")
            ax.text((e["start"] - t0) * 1e3 + w / 2, r, label, ha="center", va="center", fontsize=7, color="white")
    ax.set_yticks(range(len(events)), [f"rank {r}" for r in range(len(events))])
    ax.invert_yaxis()
    ax.set_xlabel("time since the step began (ms)")
    ax.set_title(title)
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color=colors["F"][0], label="forward"), Patch(color=colors["B"][0], label="backward")],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig = fig or ax.figure
    if path is not None:
        fig.savefig(path, dpi=120, bbox_inches="tight")
    return fig
