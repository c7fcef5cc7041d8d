"""The ranks of a ``dp × pp × cp × tp`` job laid out on its axes, with the process group of each axis outlined,
drawn from a :class:`dlo.runtime.grid.Grid` (its ``coords`` and ``groups``).

Each panel shows the same ranks: the ``dp`` replicas side by side, in each replica one row per pipeline stage
(``pp``, stage 0 on top), in each row the ``cp`` blocks and in each block the ``tp`` slices. A panel per axis of
size > 1 colours every rank by its group along that axis and outlines the group: a frame where its members are
drawn next to each other (a tp group, a pp column), a line through them where they are not (the dp replicas of
one slice). ``tests/test_figures_grid.py`` checks that the drawn groups are the Grid's.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch

from dlo.lessons.figures.style import _record, box, canvas, label, rank_color, save
from dlo.runtime.grid import AXES, Grid

CP_GAP = 0.3  # data units between two cp blocks of a stage row
DP_GAP = 1.2  # between two replicas
PANEL_GAP = 1.6  # between two panels (the panel's title sits there)
WHAT = {"tp": "tensor-parallel groups: the slices of one stage's matrices (consecutive ranks, one node)",
        "cp": "context-parallel groups: the sequence shards of one stage slice",
        "pp": "pipeline groups: the stages of one pipeline, activations flow down",
        "dp": "data-parallel groups: the replicas of one slice, gradients averaged"}


def rank_position(grid: Grid, rank: int) -> tuple[float, float]:
    """Lower-left corner of ``rank``'s box inside a panel (y from the panel's top row down)."""
    c = grid.coords(rank)
    replica_w = grid.cp * grid.tp + (grid.cp - 1) * CP_GAP
    x = c["dp"] * (replica_w + DP_GAP) + c["cp"] * (grid.tp + CP_GAP) + c["tp"]
    return x, -float(c["pp"])


def _contiguous(grid: Grid, members: list[int]) -> bool:
    """Whether the members' boxes fill their bounding box (then a frame outlines exactly them)."""
    xs = sorted({rank_position(grid, r)[0] for r in members})
    ys = sorted({rank_position(grid, r)[1] for r in members})
    same_row = len(ys) == 1 and all(abs(b - a - 1) < 1e-9 for a, b in zip(xs, xs[1:]))
    same_col = len(xs) == 1 and all(abs(b - a - 1) < 1e-9 for a, b in zip(ys, ys[1:]))
    return len(members) == 1 or same_row or same_col


def _panel(ax: plt.Axes, grid: Grid, axis: str, top: float) -> None:
    groups = grid.groups(axis)
    label(ax, 0, top + 0.55, f"{axis} = {getattr(grid, axis)}: {WHAT[axis]}", fontsize=8, weight="bold")
    for g, members in enumerate(groups):
        colour = rank_color(g)
        for rank in members:
            x, y = rank_position(grid, rank)
            c = grid.coords(rank)
            box(ax, x + 0.05, top + y - 0.95, 0.9, 0.9, str(rank), color=colour, text_color="white", fontsize=8,
                tag=("rank", axis, rank, tuple(c[a] for a in AXES), g))
        pts = [rank_position(grid, r) for r in members]
        if _contiguous(grid, members):
            x0, y0 = min(p[0] for p in pts), min(p[1] for p in pts)
            x1, y1 = max(p[0] for p in pts) + 1, max(p[1] for p in pts) + 1
            ax.add_patch(plt.Rectangle((x0, top + y0 - 1), x1 - x0, y1 - y0, fill=False, edgecolor="#222222",
                                       linewidth=1.6))
            _record(ax, "group", axis=axis, members=list(members), shape="frame")
        else:
            for a, b in zip(pts, pts[1:]):  # arcs over the ranks between them, member to member
                ax.add_patch(FancyArrowPatch((a[0] + 0.5, top + a[1] - 0.3), (b[0] + 0.5, top + b[1] - 0.3),
                                             arrowstyle="-", connectionstyle="arc3,rad=-0.25", color="#222222",
                                             linewidth=1.3))
            ax.plot([p[0] + 0.5 for p in pts], [top + p[1] - 0.3 for p in pts], "o", color="#222222", markersize=3)
            _record(ax, "group", axis=axis, members=list(members), shape="line")


def grid_figure(grid: Grid, *, path: str | Path | None = None) -> plt.Figure:
    """The picture of ``grid`` (see the module): one panel per axis of size > 1, the axes of size 1 named."""
    shown = [a for a in ("tp", "cp", "pp", "dp") if getattr(grid, a) > 1]
    width = grid.dp * (grid.cp * grid.tp + (grid.cp - 1) * CP_GAP) + (grid.dp - 1) * DP_GAP
    panel_h = grid.pp + PANEL_GAP
    height = max(len(shown), 1) * panel_h + 0.6
    sizes = " × ".join(f"{a}={getattr(grid, a)}" for a in AXES)
    fig, ax = canvas(max(width, 12.0), height, title=f"{grid.world_size} ranks as dp × pp × cp × tp: {sizes}",
                     inches_per_unit=0.6)
    top = height - PANEL_GAP + 0.6
    for axis in shown:
        _panel(ax, grid, axis, top)
        for d in range(grid.dp):
            x, _ = rank_position(grid, grid.rank_of(dp=d))
            label(ax, x, top + 0.15, f"replica dp={d}", fontsize=7)
        top -= panel_h
    ones = [a for a in AXES if getattr(grid, a) == 1]
    if ones:
        label(ax, 0, 0.25, f"size 1 (no group to draw: each rank alone): {', '.join(ones)}. Rows: pipeline stages "
                           "(stage 0 on top); columns: tp slices", fontsize=7)
    return save(fig, path)


def drawn_groups(fig: plt.Figure) -> dict[str, list[list[int]]]:
    """``{axis: [members of each outlined group]}`` as drawn."""
    out: dict[str, list[list[int]]] = {}
    for d in getattr(fig, "_dlo_drawn", []):
        if d["kind"] == "group":
            out.setdefault(d["axis"], []).append(d["members"])
    return out
