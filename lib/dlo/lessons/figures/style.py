"""Drawing primitives shared by every concept figure: one palette, boxes, arrows, a timeline row.

Every figure of :mod:`dlo.lessons.figures` is a plain matplotlib Figure with hidden axes in data coordinates
(x to the right, y up), so a drawing reads as a list of boxes and arrows. ``drawn(fig)`` returns what was drawn
(the labels and boxes, in order), which the tests compare with the data the exercise uses.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, Rectangle

#: One colour per role, the same in every figure (ranks/devices use RANKS in order).
PALETTE = {
    "forward": "#4C72B0", "backward": "#DD8452", "communication": "#55A868", "idle": "#EEEEEE",
    "memory": "#8172B3", "compute": "#C44E52", "data": "#937860", "highlight": "#FFD92F", "text": "#222222",
    "sign": "#C44E52", "exponent": "#55A868", "mantissa": "#4C72B0", "grid": "#BBBBBB",
}
RANKS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C"]


def rank_color(rank: int) -> str:
    """The colour of rank (or device, or shard) ``rank``, cycling through RANKS."""
    return RANKS[rank % len(RANKS)]


def canvas(width: float, height: float, *, title: str | None = None, inches_per_unit: float = 0.45,
           max_inches: float = 13.0) -> tuple[plt.Figure, plt.Axes]:
    """A figure whose axes span [0, width] x [0, height] in data units, axes hidden, aspect kept."""
    scale = min(inches_per_unit, max_inches / max(width, 1e-9))
    fig, ax = plt.subplots(figsize=(max(3.0, width * scale), max(1.5, height * scale + (0.4 if title else 0))))
    ax.set_xlim(0, width)
    ax.set_ylim(0, height)
    ax.set_aspect("equal" if 0.2 < width / max(height, 1e-9) < 8 else "auto")
    ax.axis("off")
    if title:
        ax.set_title(title, fontsize=11)
    fig._dlo_drawn = []  # what the figure shows, in drawing order (see drawn())
    return fig, ax


def _record(ax: plt.Axes, kind: str, **what: Any) -> None:
    fig = ax.figure
    if not hasattr(fig, "_dlo_drawn"):
        fig._dlo_drawn = []
    fig._dlo_drawn.append({"kind": kind, **what})


def box(ax: plt.Axes, x: float, y: float, w: float, h: float, text: str = "", *, color: str = "#FFFFFF",
        edge: str = "#333333", fontsize: float = 9, text_color: str | None = None, hatch: str | None = None,
        tag: Any = None) -> Rectangle:
    """A rectangle with its lower-left corner at (x, y) and centred text; ``tag`` is recorded with it."""
    rect = Rectangle((x, y), w, h, facecolor=color, edgecolor=edge, linewidth=0.8, hatch=hatch)
    ax.add_patch(rect)
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize,
                color=text_color or PALETTE["text"])
    _record(ax, "box", x=x, y=y, w=w, h=h, text=text, tag=tag)
    return rect


def arrow(ax: plt.Axes, start: tuple[float, float], end: tuple[float, float], text: str = "", *,
          color: str = "#333333", style: str = "-|>", fontsize: float = 8, tag: Any = None) -> None:
    """An arrow from ``start`` to ``end`` with an optional label at its middle."""
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=10, color=color, linewidth=1.0))
    if text:
        ax.text((start[0] + end[0]) / 2, (start[1] + end[1]) / 2, text, ha="center", va="bottom",
                fontsize=fontsize, color=color)
    _record(ax, "arrow", start=start, end=end, text=text, tag=tag)


def label(ax: plt.Axes, x: float, y: float, text: str, *, fontsize: float = 9, ha: str = "left",
          va: str = "center", weight: str = "normal", color: str | None = None) -> None:
    """Free text at (x, y)."""
    ax.text(x, y, text, ha=ha, va=va, fontsize=fontsize, fontweight=weight, color=color or PALETTE["text"])
    _record(ax, "label", x=x, y=y, text=text)


def timeline(ax: plt.Axes, y: float, spans: Iterable[tuple[float, float, str, str]], *, height: float = 0.8,
             row_label: str | None = None, fontsize: float = 7) -> None:
    """One row of a Gantt chart at height ``y``: each span is (start, duration, text, colour)."""
    if row_label:
        label(ax, -0.2, y + height / 2, row_label, ha="right", fontsize=fontsize + 1)
    for start, duration, text, color in spans:
        box(ax, start, y, duration, height, text, color=color, fontsize=fontsize, tag=("span", row_label, text))


def legend(ax: plt.Axes, entries: dict[str, str], *, loc: str = "upper right", fontsize: float = 8) -> None:
    """A legend of coloured squares: {text: colour}."""
    handles = [Rectangle((0, 0), 1, 1, facecolor=c, edgecolor="#333333", linewidth=0.5) for c in entries.values()]
    ax.legend(handles, list(entries), loc=loc, fontsize=fontsize, frameon=False)


def drawn(fig: plt.Figure, kind: str | None = None) -> list[dict[str, Any]]:
    """What ``fig`` shows, in drawing order (optionally only one kind: "box", "arrow", "label")."""
    items = getattr(fig, "_dlo_drawn", [])
    return [d for d in items if kind is None or d["kind"] == kind]


def save(fig: plt.Figure, path: str | Path | None) -> plt.Figure:
    """Writes ``fig`` as a PNG when ``path`` is given; returns it (a notebook displays the returned figure)."""
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120, bbox_inches="tight")
    return fig
