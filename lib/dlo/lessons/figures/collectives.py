"""The five collectives of data and model parallelism, and the ring all-reduce, drawn from pure references.

:func:`before` gives every rank's buffer before a collective (small integers that say where they come from:
rank ``r`` holds ``10·(r+1) + i``), :func:`reference` what each rank holds after it, computed in plain Python
as ``torch.distributed`` defines it (``broadcast`` from rank 0, ``all_reduce`` and ``reduce_scatter`` with a sum,
``all_gather`` in rank order, ``all_to_all`` of one element per pair of ranks). :func:`collectives_figure` draws
both per rank; ``tests/test_figures_collectives.py`` checks the drawn "after" values against what
``torch.distributed`` computes on 2 and 3 gloo processes (the demo worker :mod:`dlo.lessons.collectives_demo`
runs each collective on these same buffers).

:func:`ring_allreduce` simulates the ring algorithm chunk by chunk: N − 1 reduce-scatter steps (each rank sends
one chunk to its right neighbour, which adds it to its own), after which rank r holds the complete sum of chunk
(r + 1) mod N, then N − 1 all-gather steps (each rank forwards a complete chunk, the receiver keeps it).
:func:`ring_figure` draws every step; each rank sends and receives 2 (N − 1)/N of the buffer in all, whatever N.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt

from dlo.lessons.figures.style import PALETTE, arrow, box, canvas, drawn, label, rank_color, save

COLLECTIVES = ("broadcast", "all_reduce", "reduce_scatter", "all_gather", "all_to_all")
EXPLAIN = {
    "broadcast": "broadcast (src=0): rank 0's buffer copied to every rank",
    "all_reduce": "all_reduce (sum): every rank gets the element-wise sum",
    "reduce_scatter": "reduce_scatter (sum): rank r gets the sum of chunk r only",
    "all_gather": "all_gather: every rank gets every rank's piece, in rank order",
    "all_to_all": "all_to_all: element j of rank r goes to rank j (a transpose)",
}


def before(name: str, world: int) -> list[list[int]]:
    """Every rank's buffer before collective ``name``: ``world`` elements ``10·(r+1) + i`` (one for all_gather)."""
    if name not in COLLECTIVES:
        raise ValueError(f"unknown collective {name!r}: choose one of {', '.join(COLLECTIVES)}")
    if world < 1:
        raise ValueError(f"world must be at least 1, not {world}")
    width = 1 if name == "all_gather" else world
    return [[10 * (r + 1) + i for i in range(width)] for r in range(world)]


def reference(name: str, buffers: list[list[int]]) -> list[list[int]]:
    """What every rank holds after collective ``name`` applied to ``buffers`` (one list per rank)."""
    world = len(buffers)
    if name == "broadcast":
        return [list(buffers[0]) for _ in range(world)]
    if name == "all_reduce":
        total = [sum(col) for col in zip(*buffers)]
        return [list(total) for _ in range(world)]
    if name == "reduce_scatter":
        chunk = len(buffers[0]) // world
        total = [sum(col) for col in zip(*buffers)]
        return [total[r * chunk:(r + 1) * chunk] for r in range(world)]
    if name == "all_gather":
        gathered = [v for buf in buffers for v in buf]
        return [list(gathered) for _ in range(world)]
    if name == "all_to_all":
        chunk = len(buffers[0]) // world
        return [[v for src in range(world) for v in buffers[src][r * chunk:(r + 1) * chunk]] for r in range(world)]
    raise ValueError(f"unknown collective {name!r}: choose one of {', '.join(COLLECTIVES)}")


def _row(ax: plt.Axes, x: float, y: float, values: list, rank: int, tag: tuple, cell: float = 1.0) -> None:
    for j, v in enumerate(values):
        box(ax, x + j * cell, y, cell, 0.7, f"{v:g}", color=rank_color(rank), text_color="white", tag=(*tag, j))


def _origin_colour(name: str, j: int, length: int, world: int) -> str:
    """Where element j of a rank's result comes from: rank 0 (broadcast), a sum (reductions), rank j's piece."""
    if name == "broadcast":
        return rank_color(0)
    if name in ("all_reduce", "reduce_scatter"):
        return PALETTE["communication"]
    return rank_color(j // max(1, length // world))


def collectives_figure(world: int = 2, names: tuple[str, ...] = COLLECTIVES, *,
                       path: str | Path | None = None) -> plt.Figure:
    """One panel per collective: each rank's buffer before (left) and after (right). Boxes are tagged
    ``("before"|"after", name, rank, index)`` with the value as their text."""
    width = 2.2 + 2 * world + 2.0
    panel = world * 0.9 + 1.3
    fig, ax = canvas(width, panel * len(names), title=f"Collectives on {world} ranks: buffers before → after")
    for k, name in enumerate(names):
        top = panel * (len(names) - k)
        label(ax, 0.0, top - 0.25, EXPLAIN[name], fontsize=9, weight="bold")
        start, end = before(name, world), reference(name, before(name, world))
        for r in range(world):
            y = top - 1.35 - r * 0.9
            label(ax, 0.0, y + 0.35, f"rank {r}", fontsize=8)
            _row(ax, 1.2, y, start[r], r, ("before", name, r))
            arrow(ax, (1.3 + world, y + 0.35), (2.6 + world, y + 0.35))
            for j, v in enumerate(end[r]):
                box(ax, 2.8 + world + j, y, 1.0, 0.7, f"{v:g}", color=_origin_colour(name, j, len(end[r]), world),
                    text_color="white", tag=("after", name, r, j))
    return save(fig, path)


def drawn_after(fig: plt.Figure, name: str, world: int) -> list[list[float]]:
    """The "after" values ``fig`` shows for collective ``name``, per rank (what the test compares)."""
    rows: list[list[float]] = [[] for _ in range(world)]
    for d in drawn(fig, "box"):
        tag = d["tag"]
        if tag and tag[0] == "after" and tag[1] == name:
            rows[tag[2]].append(float(d["text"]))
    return rows


def ring_allreduce(buffers: list[list[int]]) -> list[dict]:
    """The ring all-reduce of ``buffers`` (rank r's list of N chunks, N ranks), step by step: a list of states,
    ``{"phase": "start"|"reduce-scatter"|"all-gather", "step": s, "chunks": [[value per chunk] per rank],
    "sends": [(src, dst, chunk)]}``; the last state holds the all-reduce on every rank (after 2 (N − 1) steps)."""
    world = len(buffers)
    if any(len(b) != world for b in buffers):
        raise ValueError("each rank's buffer must have one chunk per rank")
    chunks = [list(b) for b in buffers]
    states = [{"phase": "start", "step": 0, "chunks": [list(c) for c in chunks], "sends": []}]
    for phase in ("reduce-scatter", "all-gather"):
        for s in range(world - 1):
            offset = -s if phase == "reduce-scatter" else 1 - s
            sends = [(r, (r + 1) % world, (r + offset) % world) for r in range(world)]
            sent = {dst: (c, chunks[src][c]) for src, dst, c in sends}  # every rank sends before anyone adds
            for dst, (c, value) in sent.items():
                chunks[dst][c] = chunks[dst][c] + value if phase == "reduce-scatter" else value
            states.append({"phase": phase, "step": s + 1, "chunks": [list(c) for c in chunks], "sends": sends})
    return states


def ring_figure(world: int = 3, *, path: str | Path | None = None) -> plt.Figure:
    """Every step of the ring all-reduce on ``world`` ranks: one row per step, one group of N chunks per rank;
    the chunk each rank receives at a step is yellow. Chunk boxes are tagged ``("chunk", state, rank, c)``."""
    states = ring_allreduce(before("all_reduce", world))
    group = world + 1.0
    width, height = 4.2 + group * world, 1.0 * len(states) + 1.0
    fig, ax = canvas(width, height, title=f"Ring all-reduce on {world} ranks: reduce-scatter, then all-gather")
    for r in range(world):
        label(ax, 4.2 + r * group + world / 2, height - 0.5, f"rank {r}", ha="center", fontsize=9, weight="bold")
    for k, state in enumerate(states):
        y = height - 1.5 - k * 1.0
        name = "before" if state["phase"] == "start" else f"{state['phase']} {state['step']}"
        label(ax, 0.0, y + 0.35, name, fontsize=8)
        received = {(dst, c) for _, dst, c in state["sends"]}
        for r in range(world):
            for c, value in enumerate(state["chunks"][r]):
                hot = (r, c) in received
                box(ax, 4.2 + r * group + c, y, 1.0, 0.7, f"{value:g}",
                    color=PALETTE["highlight"] if hot else "#FFFFFF", fontsize=8, tag=("chunk", k, r, c))
    label(ax, 0.0, 0.2, f"each step: every rank sends one chunk to rank r+1 (yellow: the chunk just received); "
                        f"{2 * (world - 1)} steps in all", fontsize=8)
    return save(fig, path)


__all__ = ["COLLECTIVES", "before", "reference", "collectives_figure", "drawn_after", "ring_allreduce",
           "ring_figure"]
