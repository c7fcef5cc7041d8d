"""The NCHW / NHWC figure of Jour 1 draws each value where the tensor's strides put it in memory."""
from __future__ import annotations

import itertools

import matplotlib
import pytest
import torch

matplotlib.use("Agg")

from dlo.lessons.figures import layout  # noqa: E402
from dlo.lessons.figures.style import drawn  # noqa: E402


def _order_from_strides(shape, fmt):
    """Each value's (n, c, h, w) in memory order, from the storage offsets of the values of a real tensor."""
    x = torch.arange(shape[0] * shape[1] * shape[2] * shape[3]).reshape(shape)
    y = x.contiguous(memory_format=fmt)  # the call the channels_last exercise makes on its images
    flat = torch.as_strided(y, (y.numel(),), (1,))  # the storage, in address order
    where = {int(v): ix for ix in itertools.product(*map(range, shape)) for v in [x[ix]]}
    return [where[int(v)] for v in flat]


@pytest.mark.parametrize("shape", [(1, 3, 2, 2), (2, 2, 2, 3), (1, 4, 3, 1)])
def test_the_drawn_order_is_the_tensor_s_memory_order(shape):
    fig = layout.layout_figure(shape)
    boxes = drawn(fig, "box")
    for name, fmt in layout.FORMATS.items():
        got = [d["tag"][1] for d in boxes if d["tag"][0] == name]
        assert got == _order_from_strides(shape, fmt) == layout.memory_order(shape, fmt)
        xs = [d["x"] for d in boxes if d["tag"][0] == name]
        assert xs == sorted(xs)  # drawn left to right in that order
    nchw, nhwc = (layout.memory_order(shape, f) for f in layout.FORMATS.values())
    if shape[1] > 1 and shape[2] * shape[3] > 1:
        assert nchw != nhwc
        assert [ix[1] for ix in nhwc[: shape[1]]] == list(range(shape[1]))  # NHWC: one pixel's channels together
