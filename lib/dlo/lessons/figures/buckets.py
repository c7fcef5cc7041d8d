"""DDP's gradient buckets: which parameters share a bucket, and when each bucket's all-reduce starts.

:func:`bucket_plan` is the rule of ``plan_buckets`` in ``Jour2/dp_scratch_train.py`` (DDP's): walk the parameters
in *reverse* order of registration (the order backward produces their gradients), close a bucket as soon as its
gradients add up to at least ``bucket_bytes``; the last bucket may be smaller. :func:`buckets_figure` draws

1. the parameters in registration order, each box as wide as its gradient's bytes, coloured by bucket;
2. backward as a timeline, last layer first (a gradient's time taken proportional to its size, a simplification);
3. each bucket's all-reduce, launched as soon as its last gradient is ready (or when the previous all-reduce
   is done: one at a time), so that all but the last overlap the rest of backward.

``tests/test_figures_buckets.py`` checks that the drawn buckets are the plan the dp_scratch solution computes,
for the course's models and two bucket sizes.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import matplotlib.pyplot as plt
import torch.nn as nn

from dlo.lessons.figures.style import PALETTE, box, canvas, drawn, label, rank_color, save

MIB = 2 ** 20


def parameter_sizes(model: nn.Module | Sequence[tuple[str, int]]) -> list[tuple[str, int]]:
    """``(name, gradient bytes)`` of every trained parameter, in registration order."""
    if isinstance(model, nn.Module):
        return [(n, p.numel() * p.element_size()) for n, p in model.named_parameters() if p.requires_grad]
    return [(str(n), int(b)) for n, b in model]


def bucket_plan(sizes: Sequence[int], bucket_bytes: int) -> list[list[int]]:
    """Indices into ``sizes`` per bucket, first bucket first: reverse registration order, a bucket closed once it
    holds at least ``bucket_bytes`` bytes (DDP's rule; the rule of dp_scratch's ``plan_buckets``)."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, not {bucket_bytes}")
    buckets: list[list[int]] = []
    current: list[int] = []
    size = 0
    for i in reversed(range(len(sizes))):
        current.append(i)
        size += sizes[i]
        if size >= bucket_bytes:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


def bucket_schedule(sizes: Sequence[int], plan: Sequence[Sequence[int]], comm_per_byte: float = 0.5) -> list[dict]:
    """When each gradient is ready and each bucket's all-reduce runs, in units of "backward time per byte":
    ``[{"bucket": b, "params": [...], "bytes": n, "ready": t, "start": t, "end": t}]``."""
    ready, t = {}, 0.0
    for i in reversed(range(len(sizes))):
        t += sizes[i]
        ready[i] = t
    out, free = [], 0.0
    for b, members in enumerate(plan):
        nbytes = sum(sizes[i] for i in members)
        start = max(max(ready[i] for i in members), free)
        free = start + comm_per_byte * nbytes
        out.append({"bucket": b, "params": list(members), "bytes": nbytes, "ready": max(ready[i] for i in members),
                    "start": start, "end": free})
    return out


def buckets_figure(model: nn.Module | Sequence[tuple[str, int]], bucket_mb: float, *, plan=None,
                   path: str | Path | None = None) -> plt.Figure:
    """The bucket layout of ``model`` (a module, or ``(name, bytes)`` pairs) for buckets of ``bucket_mb`` MiB, and
    the overlap of their all-reduces with backward. ``plan`` (default :func:`bucket_plan`) is drawn as given:
    each bucket's all-reduce box is tagged ``("bucket", b, sorted parameter indices)``."""
    named = parameter_sizes(model)
    sizes = [b for _, b in named]
    plan = bucket_plan(sizes, int(bucket_mb * MIB)) if plan is None else [list(b) for b in plan]
    total = float(sum(sizes))
    width = 24.0
    scale = width / total  # data units per byte
    schedule = bucket_schedule(sizes, plan)
    end = max(s["end"] for s in schedule) * scale
    fig, ax = canvas(max(width, end) + 3.2, 6.2,
                     title=f"{len(named)} parameter tensors, {total / MIB:.2f} MiB of gradients, "
                           f"buckets of {bucket_mb:g} MiB: {len(plan)} bucket(s)")
    owner = {i: b for b, members in enumerate(plan) for i in members}
    x = 3.2
    label(ax, 0.0, 5.0, "parameters\n(registration\norder)", fontsize=7)
    for i, (name, nbytes) in enumerate(named):
        box(ax, x, 4.6, nbytes * scale, 0.8, color=rank_color(owner[i]), edge=rank_color(owner[i]),
            tag=("param", i, owner[i]))
        x += nbytes * scale
    label(ax, 3.2, 4.3, "first layer", fontsize=7)
    label(ax, 3.2 + width, 4.3, "last layer", ha="right", fontsize=7)
    label(ax, 0.0, 3.0, "backward:\none gradient\nafter another", fontsize=7)
    t = 3.2
    for i in reversed(range(len(named))):
        box(ax, t, 2.6, sizes[i] * scale, 0.8, color=PALETTE["backward"], edge="white",
            tag=("grad", i))
        t += sizes[i] * scale
    label(ax, 0.0, 1.4, "all-reduce\nof a bucket", fontsize=7)
    for s in schedule:
        box(ax, 3.2 + s["start"] * scale, 1.0, (s["end"] - s["start"]) * scale, 0.8,
            f"{s['bucket']}" if (s["end"] - s["start"]) * scale > 0.4 else "", color=rank_color(s["bucket"]),
            text_color="white", tag=("bucket", s["bucket"], tuple(sorted(s["params"]))))
    label(ax, 3.2, 0.4, "a bucket's all-reduce starts once its last gradient is ready; only the last one "
                        "waits for the end of backward", fontsize=7)
    return save(fig, path)


def drawn_buckets(fig: plt.Figure) -> list[list[int]]:
    """The buckets ``fig`` shows, in order, each as its sorted parameter indices (what the test compares)."""
    return [list(d["tag"][2]) for d in drawn(fig, "box") if d["tag"] and d["tag"][0] == "bucket"]


__all__ = ["bucket_plan", "bucket_schedule", "buckets_figure", "drawn_buckets", "parameter_sizes"]
