"""Ring attention as a grid: which K/V block each rank holds at each ring step, drawn from dlo.parallel.context.

Rows are the ranks of a context-parallel ring of ``cp`` processes, each with its own query shard; columns are
the ring's steps. The block in each cell is :func:`dlo.parallel.context.ring_source` (the order the library's
ring uses), labelled with the sequence chunks it carries (:func:`~dlo.parallel.context.rank_chunks`), so that
over ``cp`` steps every rank's queries meet every K/V block while the blocks travel one rank down the ring.
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from dlo.lessons.figures.style import PALETTE, arrow, box, canvas, label, rank_color
from dlo.parallel.context import rank_chunks, ring_schedule, ring_source


def ring_figure(cp: int = 4, layout: str = "balanced") -> plt.Figure:
    """The ring of ``cp`` ranks: rank ``r``'s query shard on the left, then the K/V block it holds at each step."""
    cell_w, cell_h, left = 2.6, 1.1, 2.8
    width, height = left + cp * cell_w + 0.3, cp * cell_h + 2.8
    fig, ax = canvas(width, height, title=f"ring attention on cp = {cp} ranks ({layout} layout): "
                                          "the K/V block each rank holds, step by step")
    passes = sum(1 for ops in ring_schedule(cp) if ops)
    for step in range(cp):
        label(ax, left + step * cell_w + cell_w / 2, height - 1.3, f"step {step}", ha="center", weight="bold")
    for rank in range(cp):
        y = height - 2.0 - (rank + 1) * cell_h + 0.15
        box(ax, 0, y, left - 0.3, cell_h - 0.2, f"rank {rank}: Q\nchunks {rank_chunks(rank, cp, layout)}",
            color=rank_color(rank), text_color="#FFFFFF", fontsize=8, tag=("query", rank))
        for step in range(cp):
            src = ring_source(rank, step, cp)
            x = left + step * cell_w + 0.1
            box(ax, x, y, cell_w - 0.3, cell_h - 0.2, f"K/V of rank {src}\nchunks {rank_chunks(src, cp, layout)}",
                color=rank_color(src), text_color="#FFFFFF", fontsize=8, tag=("kv", rank, step, src))
            if step < cp - 1 and rank < cp - 1:  # the block moves on to rank + 1 for the next step
                arrow(ax, (x + cell_w - 0.5, y + 0.1), (x + cell_w + 0.3, y - 0.15), color=PALETTE["grid"])
    label(ax, width / 2, 0.35, f"after each of the first {passes} steps every rank sends its block to rank + 1 and "
          "receives the next from rank − 1 (the last rank's goes to rank 0)", ha="center", fontsize=8)
    return fig
