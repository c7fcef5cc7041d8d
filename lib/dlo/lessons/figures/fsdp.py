"""One FSDP2 training step, unit by unit, drawn from the units of the model the exercise wraps.

``fully_shard`` on each decoder layer, then on the root, makes one *unit* per call. Per unit, forward is
all-gather (the unit's full weights from every rank's shard) → compute → free (reshard); backward is all-gather
again → compute → reduce-scatter of the gradients (each rank keeps the sum of its shard). Prefetching issues the
next unit's all-gather while the current unit computes, on its own stream, so the two overlap. The root unit
(what no layer owns: embeddings, final norm, tied head) runs first and last; FSDP2 keeps the root's weights
gathered between forward and backward. With ``reshard_after_forward=False`` no layer is freed after its forward,
so backward needs no all-gather at all.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import matplotlib.pyplot as plt

from dlo.lessons.figures.style import PALETTE, box, canvas, label, legend, save

ROOT = "root"


def fsdp_units(model: Any) -> list[str]:
    """The units ``fully_shard`` makes of a transformers causal LM, in the order the exercise wraps them: each
    decoder layer (``model.layers.<i>``), then the root (``"root"``: embeddings, final norm, head)."""
    inner = getattr(model, "module", model)
    layers = inner.model.layers
    return [f"model.layers.{i}" for i in range(len(layers))] + [ROOT]


class Span(NamedTuple):
    phase: str  # "forward" | "backward"
    stream: str  # "compute" | "all-gather" | "reduce-scatter"
    slot: int  # the time slot (one unit's compute each)
    unit: str
    text: str
    freed: bool = False  # compute spans: the unit's gathered weights are freed when it ends


def _short(unit: str) -> str:
    return "root" if unit == ROOT else "L" + unit.rsplit(".", 1)[-1]


def unit_schedule(units: list[str], *, reshard_after_forward: bool = True) -> list[Span]:
    """The spans of one step of an FSDP2 model whose units are ``units`` (layers in order, then the root), with
    the default prefetching: each unit's all-gather runs during the compute of the unit before it."""
    layers = [u for u in units if u != ROOT]
    spans = [Span("forward", "all-gather", 0, ROOT, "AG root")]
    spans.append(Span("forward", "compute", 1, ROOT, "embed"))
    for i, layer in enumerate(layers):
        spans.append(Span("forward", "all-gather", 1 + i, layer, f"AG {_short(layer)}"))  # prefetched
        spans.append(Span("forward", "compute", 2 + i, layer, _short(layer), freed=reshard_after_forward))
    spans.append(Span("forward", "compute", 2 + len(layers), ROOT, "head"))
    back = list(reversed(layers))
    spans.append(Span("backward", "compute", 0, ROOT, "head"))
    for j, layer in enumerate(back):
        if reshard_after_forward:  # freed after forward: gathered again, one unit ahead
            spans.append(Span("backward", "all-gather", j, layer, f"AG {_short(layer)}"))
        spans.append(Span("backward", "compute", 1 + j, layer, _short(layer), freed=True))
        spans.append(Span("backward", "reduce-scatter", 2 + j, layer, f"RS {_short(layer)}"))
    spans.append(Span("backward", "compute", 1 + len(back), ROOT, "embed"))
    spans.append(Span("backward", "reduce-scatter", 2 + len(back), ROOT, "RS root"))
    return spans


_ROWS = [("forward", "compute"), ("forward", "all-gather"), ("backward", "compute"), ("backward", "all-gather"),
         ("backward", "reduce-scatter")]
_COLORS = {("forward", "compute"): PALETTE["forward"], ("backward", "compute"): PALETTE["backward"],
           "all-gather": PALETTE["communication"], "reduce-scatter": PALETTE["memory"]}


def unit_timeline(units: list[str] | Any, *, reshard_after_forward: bool = True, path: str | None = None) -> plt.Figure:
    """The picture of one FSDP2 step of a model with ``units`` (a list from :func:`fsdp_units`, or the model):
    a compute row and the communication rows, forward above backward, one slot per unit."""
    if not isinstance(units, list):
        units = fsdp_units(units)
    spans = unit_schedule(units, reshard_after_forward=reshard_after_forward)
    slots = max(s.slot for s in spans) + 1
    w, x0 = 1.6, 3.2
    height = len(_ROWS) + 3.4  # the legend below the rows
    fig, ax = canvas(x0 + slots * w + 0.4, height,
                     title=f"one FSDP2 step, {len(units) - 1} decoder layers + root "
                           f"(reshard_after_forward={reshard_after_forward})")
    ys = {row: height - 1.6 - i * 1.0 - (0.4 if row[0] == "backward" else 0) for i, row in enumerate(_ROWS)}
    for (phase, stream), y in ys.items():
        label(ax, 0.1, y + 0.35, f"{phase} · {stream}", fontsize=7)
    for s in spans:
        y = ys[(s.phase, s.stream)]
        color = _COLORS.get((s.phase, s.stream), _COLORS.get(s.stream))
        x = x0 + s.slot * w
        box(ax, x + 0.05, y, w - 0.1 - (0.3 if s.freed else 0), 0.7, s.text, color=color, fontsize=7,
            text_color="white", tag=(s.phase, s.stream, s.unit))
        if s.freed:  # the gathered weights (forward) or the unsharded gradients (backward) are dropped here
            box(ax, x + w - 0.35, y, 0.3, 0.7, "", color=PALETTE["idle"], hatch="///", tag=(s.phase, "free", s.unit))
    legend(ax, {"compute (forward)": PALETTE["forward"], "compute (backward)": PALETTE["backward"],
                "all-gather (prefetched: under the previous unit)": PALETTE["communication"],
                "reduce-scatter of the gradients": PALETTE["memory"], "free (reshard)": PALETTE["idle"]},
           loc="lower center", fontsize=7)
    return save(fig, path)
