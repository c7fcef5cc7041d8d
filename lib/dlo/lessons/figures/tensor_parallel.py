"""Column- and row-parallel linear layers, and where "f" and "g" go, drawn from dlo.parallel.tensor's own layers.

:func:`tp_shards` builds :class:`~dlo.parallel.tensor.ColumnParallelLinear` and
:class:`~dlo.parallel.tensor.RowParallelLinear` as each rank of a TP group of ``tp`` would (in this one process:
each rank's slice is cut by the layers themselves), runs column -> row forward and backward, and records every
collective the layers asked for (its phase and the shape of the tensor it carried: no message is sent).
:func:`column_row_figure` draws that: the weight shard of each rank, and each collective placed where its tensor
is (the column layer's input: "f"; the row layer's output: "g").
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator
from unittest import mock

import matplotlib.pyplot as plt
import torch
from torch import nn

from dlo.lessons.figures.style import PALETTE, arrow, box, canvas, label, rank_color
from dlo.parallel import comm
from dlo.parallel.tensor import layers


@contextlib.contextmanager
def _as_rank(tp: int, rank: int, collectives: list[dict[str, Any]]) -> Iterator[None]:
    """The TP layers built and run as rank ``rank`` of ``tp``; each all-reduce is recorded instead of sent."""
    def all_reduce(x, group=None, *, phase="forward", op=None):
        if tp == 1:  # what comm.all_reduce does alone: nothing to send
            return x
        collectives.append({"op": "all_reduce", "phase": phase, "shape": tuple(x.shape)})
        return x

    with mock.patch.object(layers, "group_size", lambda group=None: tp), \
            mock.patch.object(layers, "group_rank", lambda group=None: rank), \
            mock.patch.object(comm, "all_reduce", all_reduce):
        yield


def tp_shards(d_in: int, hidden: int, d_out: int, tp: int, *, batch: int = 2) -> list[dict[str, Any]]:
    """Per rank of ``tp``: the weight shapes of ``ColumnParallelLinear(Linear(d_in, hidden))`` and
    ``RowParallelLinear(Linear(hidden, d_out))``, and the collectives column -> row ran (forward then backward)."""
    torch.manual_seed(0)
    first, second = nn.Linear(d_in, hidden, bias=False), nn.Linear(hidden, d_out, bias=False)
    out = []
    for r in range(tp):
        events: list[dict[str, Any]] = []
        with _as_rank(tp, r, events):
            column, row = layers.ColumnParallelLinear(first), layers.RowParallelLinear(second)
            x = torch.randn(batch, d_in, requires_grad=True)
            row(column(x)).sum().backward()
        out.append({"rank": r, "column": tuple(column.weight.shape), "row": tuple(row.weight.shape),
                    "collectives": events})
    return out


def _where(shape: tuple[int, ...], d_in: int, hidden: int, d_out: int) -> str:
    """Where a collective's tensor sits: the column layer's input, between the layers, or the row layer's output."""
    return {d_in: "before column", hidden: "between", d_out: "after row"}.get(shape[-1], "elsewhere")


def _phases(events: list[dict[str, Any]]) -> str:
    f = [e["phase"] for e in events]
    return ("forward: all-reduce" if "forward" in f else "forward: identity") + "\n" + \
           ("backward: all-reduce" if "backward" in f else "backward: identity")


def column_row_figure(d_in: int = 10, hidden: int = 12, d_out: int = 7, tp: int = 2) -> plt.Figure:
    """Column-parallel then row-parallel on ``tp`` ranks: each rank's weight shard (its shape as the layers built
    it), the activations between them, and "f"/"g" where the layers put their all-reduces."""
    if len({d_in, hidden, d_out}) < 3:
        raise ValueError(f"sizes {d_in}, {hidden}, {d_out}: give three different sizes, so that the shape of each "
                         "collective's tensor says where it sits")
    ranks = tp_shards(d_in, hidden, d_out, tp)
    events = ranks[0]["collectives"]
    lane, top = 1.3, 1.6
    height = tp * lane + top + 1.9
    fig, ax = canvas(21.5, height, title=f"column-parallel -> row-parallel on tp = {tp} ranks "
                                         f"({sum(e['phase'] == 'forward' for e in events)} all-reduce forward, "
                                         f"{sum(e['phase'] == 'backward' for e in events)} backward)")
    y0, span = 1.9, tp * lane - 0.3
    box(ax, 0, y0, 2.6, span, f"x\n[batch, {d_in}]\nthe same\non every rank", color=PALETTE["idle"], tag=("input",))
    box(ax, 18.9, y0, 2.6, span, f"y\n[batch, {d_out}]\nthe same\non every rank", color=PALETTE["idle"],
        tag=("output",))
    slots = {"before column": 3.1, "between": 11.0, "after row": 16.8}
    for where, x in slots.items():
        here = [e for e in events if _where(e["shape"], d_in, hidden, d_out) == where]
        if here:
            name = {"before column": "f", "after row": "g"}.get(where, "all-reduce")
            box(ax, x, y0, 1.6, span, name, color=PALETTE["highlight"], fontsize=13,
                tag=("collective", name, where, tuple(e["phase"] for e in here)))
            label(ax, x + 0.8, y0 - 0.25, _phases(here), ha="center", va="top", fontsize=7)
    for r in ranks:
        y = y0 + (tp - 1 - r["rank"]) * lane
        (h, i), (o, j) = r["column"], r["row"]
        lo = r["rank"] * h
        box(ax, 5.2, y, 4.6, lane - 0.3, f"rank {r['rank']}: W1 rows {lo}..{lo + h - 1}\nshard [{h}, {i}]",
            color=rank_color(r["rank"]), text_color="#FFFFFF", fontsize=8, tag=("column", r["rank"], r["column"]))
        arrow(ax, (9.8, y + (lane - 0.3) / 2), (12.2, y + (lane - 0.3) / 2), f"[batch, {h}]")
        box(ax, 12.2, y, 4.2, lane - 0.3, f"rank {r['rank']}: W2 cols {lo}..{lo + j - 1}\nshard [{o}, {j}]",
            color=rank_color(r["rank"]), text_color="#FFFFFF", fontsize=8, tag=("row", r["rank"], r["row"]))
    label(ax, 7.5, y0 + span + 0.45, f"column-parallel: W1 [{hidden}, {d_in}]\noutput features split",
          ha="center", fontsize=8, weight="bold")
    label(ax, 14.3, y0 + span + 0.45, f"row-parallel: W2 [{d_out}, {hidden}]\n"
          f"input features split, partial sums [batch, {d_out}]", ha="center", fontsize=8, weight="bold")
    label(ax, 10.75, 0.35, "MLP: gate, up = column; down = row.   Attention: q, k, v = column (heads split); o = row.",
          ha="center", fontsize=8)
    return fig
