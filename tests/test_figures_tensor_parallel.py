"""The column/row-parallel picture of tensor_parallel.ipynb is drawn from dlo.parallel.tensor's own layers: each
drawn shard has the shape of that rank's weight, and "f" and "g" sit where the layers put their all-reduces."""
from __future__ import annotations

import matplotlib.pyplot as plt
import pytest
import torch
from torch import nn

from dlo.lessons.figures.style import drawn
from dlo.lessons.figures.tensor_parallel import column_row_figure, tp_shards
from dlo.parallel import comm
from dlo.parallel.tensor import layers

SIZES = [(10, 12, 7), (9, 24, 5)]  # d_in, hidden, d_out: all distinct, hidden divisible by 2, 3 and 4


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _tags(fig, kind):
    return [d["tag"] for d in drawn(fig, "box") if d["tag"] and d["tag"][0] == kind]


@pytest.mark.parametrize("tp", [2, 3, 4])
@pytest.mark.parametrize("d_in,hidden,d_out", SIZES)
def test_drawn_shards_are_the_layers_weight_shapes(tp, d_in, hidden, d_out):
    shards = tp_shards(d_in, hidden, d_out, tp)
    fig = column_row_figure(d_in, hidden, d_out, tp)
    assert [(r, shape) for _, r, shape in _tags(fig, "column")] == [(s["rank"], s["column"]) for s in shards]
    assert [(r, shape) for _, r, shape in _tags(fig, "row")] == [(s["rank"], s["row"]) for s in shards]
    # Megatron's split: output features of the first layer, input features of the second
    assert all(s["column"] == (hidden // tp, d_in) and s["row"] == (d_out, hidden // tp) for s in shards)


@pytest.mark.parametrize("tp", [2, 3, 4])
def test_the_shards_are_the_ranks_slices_of_the_full_weights(tp):
    """tp_shards builds the layers as each rank would: their slices, put together, are the full matrices."""
    torch.manual_seed(0)
    first, second = nn.Linear(10, 12, bias=False), nn.Linear(12, 7, bias=False)
    cols, rows = [], []
    for r in range(tp):
        with layers_as_rank(tp, r):
            cols.append(layers.ColumnParallelLinear(first).weight.detach())
            rows.append(layers.RowParallelLinear(second).weight.detach())
    assert torch.equal(torch.cat(cols, 0), first.weight.detach())
    assert torch.equal(torch.cat(rows, 1), second.weight.detach())


def layers_as_rank(tp, r):
    from dlo.lessons.figures.tensor_parallel import _as_rank
    return _as_rank(tp, r, [])


@pytest.mark.parametrize("tp", [2, 3, 4])
@pytest.mark.parametrize("d_in,hidden,d_out", SIZES)
def test_f_and_g_are_drawn_where_the_layers_put_their_all_reduces(tp, d_in, hidden, d_out):
    events = tp_shards(d_in, hidden, d_out, tp)[0]["collectives"]
    # the layers: one all-reduce of the input's gradient (f, backward), one of the output (g, forward)
    assert sorted((e["phase"], e["shape"][-1]) for e in events) == [("backward", d_in), ("forward", d_out)]
    fig = column_row_figure(d_in, hidden, d_out, tp)
    boxes = {d["tag"][0:2] if d["tag"][0] == "collective" else d["tag"][0]: d for d in drawn(fig, "box") if d["tag"]}
    f, g = boxes[("collective", "f")], boxes[("collective", "g")]
    column_x = [d["x"] for d in drawn(fig, "box") if d["tag"] and d["tag"][0] == "column"]
    row_x = [d["x"] + d["w"] for d in drawn(fig, "box") if d["tag"] and d["tag"][0] == "row"]
    assert f["x"] + f["w"] <= min(column_x) and g["x"] >= max(row_x)
    assert f["tag"][3] == ("backward",) and g["tag"][3] == ("forward",)
    assert len(_tags(fig, "collective")) == 2


def test_drawing_leaves_the_layers_and_collectives_as_they_were():
    column_row_figure(10, 12, 7, 3)
    assert layers.group_size is comm.group_size and layers.group_rank is comm.group_rank
    assert comm.all_reduce.__qualname__ == "all_reduce" and comm.all_reduce.__module__ == "dlo.parallel.comm"
    assert tp_shards(10, 12, 7, 1)[0]["collectives"] == []  # one process: the layers send nothing
