"""The roofline, sketched from a device's peak and bandwidth and the arithmetic intensities of the kernels it runs.

Log-log axes: the slanted roof ``I x W`` (memory-bound) meets the flat roof ``P`` (compute-bound) at the ridge
``I* = P / W`` (:func:`dlo.measure.roofline.knee`); each kernel sits on the roof at its intensity, left of the
ridge (memory-bound) or right of it (compute-bound). ``drawn(fig)`` records the ridge and every point.
"""
from __future__ import annotations

import math
from typing import Iterable, Mapping

import matplotlib.pyplot as plt
import torch

from dlo.lessons.figures.style import PALETTE, _record, canvas, label, save
from dlo.measure import roofline as rl

_W, _H = 14.0, 7.0  # canvas units
_X0, _X1, _Y0, _Y1 = 1.2, 13.4, 0.9, 6.0  # the plotting area inside it


def matmul_points(sizes: Iterable[int], dtype: torch.dtype | int = torch.bfloat16, *,
                  matvec: int | None = None) -> dict[str, float]:
    """``{"n = 64": intensity, ...}``: square matmuls of each size (and a ``matvec x matvec`` matrix-vector
    product when given), ideal traffic, as :func:`dlo.measure.roofline.arithmetic_intensity` counts it."""
    points = {f"matmul n = {n}": rl.arithmetic_intensity(n, n, n, dtype) for n in sizes}
    if matvec:
        points[f"matrix-vector {matvec}"] = rl.arithmetic_intensity(matvec, 1, matvec, dtype)
    return points


def roofline_sketch(peak_flops: float, bandwidth: float, points: Mapping[str, float], *, name: str = "",
                    path: str | None = None) -> plt.Figure:
    """The roofline of a device of peak ``peak_flops`` (FLOP/s) and bandwidth ``bandwidth`` (byte/s), with its
    ridge and each of ``points`` ({label: intensity in FLOP/byte}) on the roof, coloured by the roof that
    limits it."""
    ridge = rl.knee(peak_flops, bandwidth)
    lo = math.floor(math.log10(min([ridge / 30, *points.values()]) / 2))
    hi = math.ceil(math.log10(max([ridge * 30, *points.values()]) * 2))
    ymax = math.log10(peak_flops) + 0.4
    ymin = math.log10(rl.attainable(10.0 ** lo, peak_flops, bandwidth)) - 0.3
    sx = lambda i: _X0 + (math.log10(i) - lo) / (hi - lo) * (_X1 - _X0)  # noqa: E731
    sy = lambda f: _Y0 + (math.log10(f) - ymin) / (ymax - ymin) * (_Y1 - _Y0)  # noqa: E731
    fig, ax = canvas(_W, _H, title=f"Roofline{' of ' + name if name else ''}: peak {peak_flops / 1e12:.0f} TFLOP/s, "
                                   f"bandwidth {bandwidth / 1e9:,.0f} GB/s")
    ax.plot([_X0, _X1], [_Y0, _Y0], color=PALETTE["grid"], lw=0.8)
    ax.plot([_X0, _X0], [_Y0, _Y1], color=PALETTE["grid"], lw=0.8)
    for e in range(lo, hi + 1):
        ax.text(sx(10.0 ** e), _Y0 - 0.3, f"$10^{{{e}}}$", ha="center", va="top", fontsize=7)
    label(ax, (_X0 + _X1) / 2, 0.15, "arithmetic intensity (FLOP / byte, log scale)", ha="center", fontsize=8)
    label(ax, 0.15, (_Y0 + _Y1) / 2, "FLOP/s (log)", fontsize=8)
    xs = [10.0 ** lo, ridge, 10.0 ** hi]
    ax.plot([sx(x) for x in xs], [sy(rl.attainable(x, peak_flops, bandwidth)) for x in xs], color=PALETTE["text"], lw=2)
    ax.plot([sx(ridge)] * 2, [_Y0, sy(peak_flops)], ls="--", color=PALETTE["grid"], lw=1)
    ax.text(sx(ridge), sy(peak_flops) + 0.25, f"ridge I* = P / W = {ridge:.0f} FLOP/B", ha="center", fontsize=8)
    _record(ax, "ridge", x=sx(ridge), intensity=ridge, text=f"{ridge:.0f} FLOP/B")
    label(ax, sx(math.sqrt(ridge * 10.0 ** lo)), _Y0 + 0.3, "memory-bound", ha="center", weight="bold",
          color=PALETTE["memory"])
    label(ax, sx(math.sqrt(ridge * 10.0 ** hi)), _Y0 + 0.3, "compute-bound", ha="center", weight="bold",
          color=PALETTE["compute"])
    for i, (text, intensity) in enumerate(sorted(points.items(), key=lambda kv: kv[1])):
        bound = "memory-bound" if intensity < ridge else "compute-bound"
        x, y = sx(intensity), sy(rl.attainable(intensity, peak_flops, bandwidth))
        ax.plot([x], [y], "o", color=PALETTE["memory" if bound == "memory-bound" else "compute"], ms=7, zorder=3)
        ax.text(x + 0.1, y - 0.3 - 0.8 * (i % 2), f"{text}\n{intensity:,.1f} FLOP/B", fontsize=7, va="top")
        _record(ax, "point", x=x, intensity=intensity, text=text, bound=bound)
    return save(fig, path)
