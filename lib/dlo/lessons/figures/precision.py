"""The bits of a floating-point number: sign, exponent and mantissa of fp32, bf16 and fp16 (Jour 1, step 2).

The widths come from ``torch.finfo`` of each dtype (the mantissa from its ``eps``, the exponent from what is left),
and each row is labelled with the range (largest value, smallest normal value) and the precision (``eps``, the gap
after 1.0) that ``torch.finfo`` gives: the same dtypes the mixed-precision exercise passes to ``torch.autocast``.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

import torch

from dlo.lessons.figures.style import PALETTE, box, canvas, label, legend, save

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.float64: "fp64"}


def fields(dtype: torch.dtype) -> dict[str, Any]:
    """Bit widths and the range and precision of ``dtype``, read from ``torch.finfo``."""
    info = torch.finfo(dtype)
    mantissa = round(-math.log2(info.eps))  # eps = 2**-mantissa: the gap between 1.0 and the next number
    return {"name": _NAMES.get(dtype, str(dtype).replace("torch.", "")), "bits": info.bits, "sign": 1,
            "exponent": info.bits - 1 - mantissa, "mantissa": mantissa, "max": float(info.max),
            "smallest_normal": float(info.tiny), "eps": float(info.eps)}


def bits_figure(dtypes: Sequence[torch.dtype] = DTYPES, path: str | Path | None = None):
    """One row per dtype: one box per bit field, as wide as its number of bits, with range and precision."""
    rows = [fields(d) for d in dtypes]
    width = max(r["bits"] for r in rows)
    unit = 24.0 / width  # 24 drawing units for the widest type
    fig, ax = canvas(24 + 15, 1.4 * len(rows) + 0.6, title="The bits of a number: sign, exponent (range), "
                                                         "mantissa (precision)")
    for i, r in enumerate(rows):
        y = 1.4 * (len(rows) - 1 - i) + 0.3
        label(ax, -0.3, y + 0.45, r["name"], ha="right", weight="bold")
        x = 0.0
        for part in ("sign", "exponent", "mantissa"):
            w = r[part] * unit
            box(ax, x, y, w, 0.9, str(r[part]), color=PALETTE[part], text_color="white", tag=(r["name"], part, r[part]))
            x += w
        label(ax, x + 0.4, y + 0.45, f"max {r['max']:.3g}, smallest normal {r['smallest_normal']:.3g}, "
                                     f"eps {r['eps']:.3g}", fontsize=8)
    legend(ax, {"sign": PALETTE["sign"], "exponent bits": PALETTE["exponent"], "mantissa bits": PALETTE["mantissa"]},
           loc="lower right")
    return save(fig, path)
