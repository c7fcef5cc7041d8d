"""Kernel fusion, drawn from the operations of the function that is compiled.

Eager PyTorch runs one kernel per operation: each reads its tensor inputs from memory and writes its result back,
so a chain of element-wise operations moves the tensor through memory once per operation. A fused kernel (what
``torch.compile``'s Inductor generates for such a chain) reads the function's inputs once, keeps the intermediate
values in registers, and writes the result once. The operations drawn are those ``torch.fx.symbolic_trace`` records
for the function (:func:`traced_ops`), in order, so the picture cannot disagree with the code it explains.
"""
from __future__ import annotations

import operator
from typing import Any, Callable

import matplotlib.pyplot as plt
import torch
import torch.fx

from dlo.lessons.figures.style import PALETTE, arrow, box, canvas, label, save

_SYMBOLS = {operator.add: "+", operator.sub: "−", operator.mul: "×", operator.truediv: "÷", operator.pow: "**"}
_KINDS = ("call_function", "call_method", "call_module")


def _name(node: torch.fx.Node) -> str:
    target = node.target
    if node.op == "call_function" and target in _SYMBOLS:
        return _SYMBOLS[target]
    name = target if isinstance(target, str) else getattr(target, "__name__", str(target))
    return str(name).rsplit(".", 1)[-1]


def traced_ops(fn: Callable[..., Any]) -> list[dict[str, Any]]:
    """The operations of ``fn`` as ``torch.fx.symbolic_trace`` records them, in order: ``{"name", "node",
    "inputs"}``, ``inputs`` being the tensors the operation reads (graph inputs or earlier results; constants are
    not read from memory)."""
    graph = torch.fx.symbolic_trace(fn).graph
    return [{"name": _name(n), "node": n.name, "inputs": [a.name for a in n.all_input_nodes]}
            for n in graph.nodes if n.op in _KINDS]


def graph_io(fn: Callable[..., Any]) -> tuple[list[str], list[str]]:
    """The names of ``fn``'s tensor inputs and of the results it returns, as traced."""
    graph = torch.fx.symbolic_trace(fn).graph
    inputs = [n.name for n in graph.nodes if n.op == "placeholder"]
    outputs = [a.name for n in graph.nodes if n.op == "output" for a in n.all_input_nodes]
    return inputs, outputs


def fusion(fn: Callable[..., Any], *, title: str | None = None, path: str | None = None) -> plt.Figure:
    """Eager's kernels against one fused kernel for ``fn`` (see the module): above, one box per traced operation
    with its reads from and its write to memory; below, the same operations inside one kernel that reads the
    function's inputs once and writes its result once."""
    ops = traced_ops(fn)
    inputs, outputs = graph_io(fn)
    n = len(ops)
    step = 2.0
    width = max(n * step + 3.0, 12.0)
    fig, ax = canvas(width, 9.0, title=title or f"{getattr(fn, '__name__', 'fn')}: {n} operations, eager vs fused")
    reads = sum(len(op["inputs"]) for op in ops)
    label(ax, 0.1, 8.5, f"eager: {n} kernels, {reads} tensor reads and {n} writes through memory",
          weight="bold", fontsize=8)
    box(ax, 0.1, 4.9, width - 0.2, 0.6, "memory (GPU HBM or CPU RAM)", color=PALETTE["memory"],
        text_color="white", fontsize=7, tag=("memory", "eager"))
    for i, op in enumerate(ops):
        x = 1.5 + i * step
        box(ax, x, 6.4, 1.6, 1.0, op["name"], color=PALETTE["compute"], text_color="white", fontsize=8,
            tag=("eager_op", i, op["name"]))
        k = len(op["inputs"])
        for j, src in enumerate(op["inputs"]):
            xr = x + 0.2 + 0.6 * j / max(k, 1)
            arrow(ax, (xr, 5.5), (xr, 6.4), color=PALETTE["memory"], tag=("read", i, src))
        arrow(ax, (x + 1.35, 6.4), (x + 1.35, 5.5), color=PALETTE["compute"], tag=("write", i, op["node"]))
    label(ax, 0.1, 4.2, f"compiled: 1 fused kernel, {len(inputs)} reads and {len(outputs)} write(s); "
                        "the values in between stay in registers", weight="bold", fontsize=8)
    box(ax, 1.3, 1.7, n * step + 0.0, 1.6, "", color=PALETTE["highlight"], tag=("fused", n))
    for i, op in enumerate(ops):
        x = 1.5 + i * step
        box(ax, x, 2.0, 1.6, 1.0, op["name"], color="#FFFFFF", fontsize=8, tag=("fused_op", i, op["name"]))
        if i:
            arrow(ax, (x - 0.4, 2.5), (x, 2.5), color=PALETTE["text"])
    box(ax, 0.1, 0.2, width - 0.2, 0.6, "memory (GPU HBM or CPU RAM)", color=PALETTE["memory"],
        text_color="white", fontsize=7, tag=("memory", "fused"))
    for j, name in enumerate(inputs):
        xr = 1.5 + 0.5 * j
        arrow(ax, (xr, 0.8), (xr, 2.0), name, color=PALETTE["memory"], tag=("fused_read", name))
    for j, name in enumerate(outputs):
        xw = 1.5 + (n - 1) * step + 1.3 - 0.5 * j
        arrow(ax, (xw, 2.0), (xw, 0.8), "result", color=PALETTE["compute"], tag=("fused_write", name))
    return save(fig, path)
