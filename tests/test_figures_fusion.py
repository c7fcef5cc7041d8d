"""The kernel-fusion picture is drawn from the function the notebook compiles: its eager kernels are the
operations torch.fx traces, in order, each with one read per tensor input and one write; the fused kernel holds the
same operations and reads only the function's inputs, writing only its result."""
from __future__ import annotations

import operator

import matplotlib
import pytest
import torch

matplotlib.use("Agg")

from dlo.lessons.figures.fusion import fusion, graph_io, traced_ops  # noqa: E402
from dlo.lessons.figures.style import drawn  # noqa: E402


def bias_gelu(x, b):  # Jour3/jit.ipynb's fusion example
    y = x + b
    return y * torch.sigmoid(1.5957691216057308 * (y + 0.044715 * y * y * y))


def softmax_vectorised(x):  # Jour3/jit.ipynb's first example
    e = torch.exp(x - x.amax(dim=1, keepdim=True))
    return e / e.sum(dim=1, keepdim=True)


def _tags(fig, kind, what="box"):
    return [d["tag"] for d in drawn(fig, what) if isinstance(d["tag"], tuple) and d["tag"][0] == kind]


def _fx_ops(fn):
    graph = torch.fx.symbolic_trace(fn).graph
    return [n for n in graph.nodes if n.op in ("call_function", "call_method", "call_module")]


@pytest.mark.parametrize("fn, count", [(bias_gelu, 8), (softmax_vectorised, 5)])
def test_the_drawn_kernels_are_the_traced_operations(fn, count):
    fx_ops = _fx_ops(fn)
    assert len(fx_ops) == count  # the notebook's text says 8 and 5 operations
    fig = fusion(fn)
    names = [op["name"] for op in traced_ops(fn)]
    assert [t[2] for t in _tags(fig, "eager_op")] == names == [t[2] for t in _tags(fig, "fused_op")]
    assert [t[1] for t in _tags(fig, "eager_op")] == list(range(count))
    # one read per tensor input of each traced node, one write per node
    assert sorted(_tags(fig, "read", "arrow")) == sorted(
        ("read", i, a.name) for i, n in enumerate(fx_ops) for a in n.all_input_nodes)
    assert _tags(fig, "write", "arrow") == [("write", i, n.name) for i, n in enumerate(fx_ops)]
    inputs, outputs = graph_io(fn)
    assert [t[1] for t in _tags(fig, "fused_read", "arrow")] == inputs
    assert [t[1] for t in _tags(fig, "fused_write", "arrow")] == outputs == [fx_ops[-1].name]
    matplotlib.pyplot.close(fig)


def test_operator_names_follow_the_code():
    ops = traced_ops(bias_gelu)
    assert [op["name"] for op in ops] == ["+", "×", "×", "×", "+", "×", "sigmoid", "×"]
    assert ops[0]["inputs"] == ["x", "b"]
    assert [op["name"] for op in traced_ops(softmax_vectorised)] == ["amax", "−", "exp", "sum", "÷"]
    assert traced_ops(lambda x: operator.sub(x, 1))[0]["inputs"] == ["x"]  # constants are not read from memory


def test_a_png(tmp_path):
    fig = fusion(softmax_vectorised, path=tmp_path / "f.png")
    assert (tmp_path / "f.png").stat().st_size > 0
    matplotlib.pyplot.close(fig)
