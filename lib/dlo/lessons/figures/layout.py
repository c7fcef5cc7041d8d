"""NCHW against NHWC (``channels_last``): the order in which a small N x C x H x W tensor's values lie in memory
(Jour 1, step 3).

The order is read from the strides of a real tensor in each memory format, converted by the same call the
channels_last exercise makes on its images (``Tensor.contiguous(memory_format=...)``): each value's place in memory
is the sum of its indices times the strides. Each value is drawn as ``c<channel>`` with its pixel ``(h, w)``,
coloured by channel: in NCHW one channel's pixels come together, in NHWC one pixel's channels do.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch

from dlo.lessons.figures.style import box, canvas, label, rank_color, save

FORMATS = {"NCHW (torch.contiguous_format)": torch.contiguous_format, "NHWC (torch.channels_last)": torch.channels_last}


def memory_order(shape: Sequence[int], memory_format: torch.memory_format) -> list[tuple[int, int, int, int]]:
    """The (n, c, h, w) index of each value of a tensor of ``shape`` in ``memory_format``, in memory order."""
    x = torch.zeros(*shape).contiguous(memory_format=memory_format)
    strides = x.stride()
    n, c, h, w = shape
    index = [(i, j, k, m) for i in range(n) for j in range(c) for k in range(h) for m in range(w)]
    return sorted(index, key=lambda ix: sum(a * s for a, s in zip(ix, strides)))


def layout_figure(shape: Sequence[int] = (1, 3, 2, 2), path: str | Path | None = None):
    """One row per memory format: the tensor's values in memory order, one box each, coloured by channel."""
    shape = tuple(shape)
    count = shape[0] * shape[1] * shape[2] * shape[3]
    fig, ax = canvas(count * 1.1 + 1, 2.4 * len(FORMATS) + 0.4,
                     title=f"A {'x'.join(map(str, shape))} tensor (N x C x H x W) in memory, address growing to the right")
    for row, (name, fmt) in enumerate(FORMATS.items()):
        y = 2.4 * (len(FORMATS) - 1 - row) + 0.3
        strides = torch.zeros(*shape).contiguous(memory_format=fmt).stride()
        label(ax, 0, y + 1.5, f"{name}: strides {tuple(strides)}", weight="bold")
        for i, (n, c, h, w) in enumerate(memory_order(shape, fmt)):
            text = (f"n{n}\n" if shape[0] > 1 else "") + f"c{c}\n{h},{w}"
            box(ax, i * 1.1, y, 1.0, 1.1, text, color=rank_color(c), text_color="white", fontsize=7,
                tag=(name, (n, c, h, w)))
    return save(fig, path)
