"""Helpers of the JIT and compilation notebook (Jour3/jit.ipynb).

- :func:`first_and_steady` times a compiled function's first call (compilation included) apart from
  its steady-state calls; :func:`time_interleaved` times several functions in alternation;
  :func:`break_even_steps` and :func:`plot_break_even` turn compile time and time per step into the
  number of steps after which compiling has paid for itself.
- :func:`graph_break_table`, :func:`count_ops`, :func:`kernel_names` and :func:`fused_lines` read what
  ``torch._dynamo.explain``, ``torch.export`` and inductor produced.
- :func:`memory_traffic` counts the bytes a chain of element-wise operations moves in eager mode
  (every operation reads its inputs and writes its output) against one fused pass.
- :func:`captured_warnings` collects the warnings and log lines of the compilers instead of printing
  them, so a cell's output stays readable; :func:`summarise_warnings` says what was caught.
- :func:`branchy` has a data-dependent branch, for ``torch.jit.trace`` vs ``torch.jit.script`` (here
  because ``script`` reads the function's source file, which a cell run outside Jupyter lacks).
- :func:`triton_bias_gelu` is a small Triton kernel (GPU only: ``triton`` is imported on first use).
"""
# No ``from __future__ import annotations`` here: Triton reads the kernel's annotations (tl.constexpr).

import contextlib
import logging
import math
import re
import statistics
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from dlo.measure import bench

# --------------------------------------------------------------------------------------------------
# Compile time against time per step
# --------------------------------------------------------------------------------------------------


def _check_seconds(name: str, value: float, positive: bool) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number of seconds, got {value!r}") from None
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        kind = "a positive" if positive else "a non-negative"
        raise ValueError(f"{name} must be {kind} finite number of seconds, got {value!r}")
    return value


def break_even_steps(compile_s: float, eager_step_s: float, compiled_step_s: float) -> float:
    """Steps after which compilation has paid for itself: ``compile_s / (eager_step_s - compiled_step_s)``.

    ``compile_s`` is the one-off cost (first call minus a steady call); the step times are steady-state
    times per step. Eager costs ``n * eager_step_s`` after n steps, compiled ``compile_s + n *
    compiled_step_s``; they are equal at the returned n (a float: round it up to count whole steps).
    Returns ``math.inf`` ("never") when the compiled step is not faster.
    """
    compile_s = _check_seconds("compile_s", compile_s, positive=False)
    eager_step_s = _check_seconds("eager_step_s", eager_step_s, positive=True)
    compiled_step_s = _check_seconds("compiled_step_s", compiled_step_s, positive=True)
    saved = eager_step_s - compiled_step_s
    if saved <= 0:
        return math.inf
    return compile_s / saved


def describe_steps(n: float) -> str:
    """``"never"`` for ``math.inf``, else the whole number of steps, e.g. ``"1,235 steps"``."""
    if math.isinf(n):
        return "never"
    whole = math.ceil(n)
    return f"{whole:,} step" + ("" if whole == 1 else "s")


def plot_break_even(compile_s: float, eager_step_s: float, compiled_step_s: float, *,
                    max_steps: int | None = None, title: str = "Is compiling worth it?",
                    path: str | Path | None = None, note: str | None = None):
    """Cumulative time against the number of steps, eager and compiled, with the break-even marked.

    The x axis runs to twice the break-even (or, when compiling never pays off, far enough for the
    compiled line's head start to show). ``note``: the decision rule did not find the compiled step faster; no
    break-even is marked and ``note`` says why. Returns the matplotlib Figure (saved when ``path`` is given).
    """
    import matplotlib.pyplot as plt

    n_star = math.inf if note else break_even_steps(compile_s, eager_step_s, compiled_step_s)
    if max_steps is None:
        if math.isinf(n_star):
            max_steps = max(10, math.ceil(2 * compile_s / eager_step_s))
        else:
            max_steps = max(10, math.ceil(2 * n_star))
    if not isinstance(max_steps, int) or max_steps < 1:
        raise ValueError(f"max_steps must be a positive integer, got {max_steps!r}")
    steps = torch.linspace(0, max_steps, 200)
    eager = steps * eager_step_s
    compiled = compile_s + steps * compiled_step_s
    fig, ax = plt.subplots(figsize=(7, 3.8))
    ax.plot(steps.numpy(), eager.numpy(), color="tab:gray", label=f"eager: {eager_step_s * 1e3:.3g} ms/step")
    ax.plot(steps.numpy(), compiled.numpy(), color="tab:green",
            label=f"compiled: {compile_s:.1f} s + {compiled_step_s * 1e3:.3g} ms/step")
    if math.isinf(n_star):
        ax.text(0.97, 0.25, note or "the compiled step is not faster:\ncompiling never pays off",
                transform=ax.transAxes, ha="right", fontsize=9, color="tab:red")
    else:
        t_star = n_star * eager_step_s
        ax.axvline(n_star, color="tab:red", linestyle="--", linewidth=1)
        ax.plot([n_star], [t_star], "o", color="tab:red")
        ax.annotate(f"break-even: {describe_steps(n_star)}\n({t_star:.1f} s)", (n_star, t_star),
                    textcoords="offset points", xytext=(8, -28), fontsize=9, color="tab:red")
    ax.set_xlabel("training steps")
    ax.set_ylabel("cumulative time (s)")
    ax.set_xlim(0, max_steps)
    ax.set_ylim(0, None)
    ax.set_title(title)
    ax.legend(loc="upper left", fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120, bbox_inches="tight")
    return fig


@dataclass
class FirstAndSteady:
    """The first call of a function (compilation included, when it is compiled) and its steady calls."""

    first_call_s: float
    times_s: list[float]
    warmup: int

    @property
    def median_s(self) -> float:
        return statistics.median(self.times_s)

    @property
    def overhead_s(self) -> float:
        """What the first call cost beyond a steady call: the compilation (never below zero)."""
        return max(self.first_call_s - self.median_s, 0.0)

    def to_record(self) -> dict[str, Any]:
        return {"first_call_s": self.first_call_s, "median_s": self.median_s, "overhead_s": self.overhead_s,
                "repeats": len(self.times_s), "warmup": self.warmup, "times_s": list(self.times_s)}


def time_first_call(fn: Callable[[], Any], device: torch.device | str | None = None) -> tuple[float, Any]:
    """Seconds taken by one synchronised call of ``fn``, and what it returned."""
    import time

    bench.synchronize(device)
    t0 = time.perf_counter()
    out = fn()
    bench.synchronize(device)
    return time.perf_counter() - t0, out


def first_and_steady(fn: Callable[[], Any], *, warmup: int = 2, repeats: int = 10,
                     device: torch.device | str | None = None, progress: str | None = None) -> FirstAndSteady:
    """Time the very first call of ``fn`` alone, then ``warmup`` untimed and ``repeats`` timed calls
    (:func:`dlo.measure.bench.time_calls`: synchronised, median reported)."""
    first, _ = time_first_call(fn, device)
    times = bench.time_calls(fn, warmup=warmup, repeats=repeats, device=device, progress=progress)
    return FirstAndSteady(first_call_s=first, times_s=times, warmup=warmup)


def time_interleaved(fns: dict[str, Callable[[], Any]], *, warmup: int = 1, repeats: int = 5,
                     device: torch.device | str | None = None, progress: str | None = None) -> dict[str, list[float]]:
    """Time several functions in alternation (A, B, A, B, ...): ``warmup`` untimed rounds, then ``repeats``
    timed rounds of one call each (:func:`dlo.measure.bench.time_calls`). Returns seconds per call, by name.

    Timing one function after the other lets a change of conditions between the two (another process
    starting, the CPU clock changing) pass for a difference between them; alternating spreads it over both.
    """
    if not fns:
        raise ValueError("time_interleaved needs at least one function to time")
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    rounds: Any = range(warmup + repeats)
    if progress:
        from tqdm.auto import tqdm

        rounds = tqdm(rounds, desc=progress, leave=False)
    times: dict[str, list[float]] = {name: [] for name in fns}
    for i in rounds:
        for name, fn in fns.items():
            t = bench.time_calls(fn, warmup=0, repeats=1, device=device)[0]
            if i >= warmup:
                times[name].append(t)
    return times


# --------------------------------------------------------------------------------------------------
# TorchScript's example
# --------------------------------------------------------------------------------------------------


def branchy(x: torch.Tensor) -> torch.Tensor:
    if x.sum() > 0:
        return x * 2
    else:
        return x - 1


# --------------------------------------------------------------------------------------------------
# Reading graphs, graph breaks and generated code
# --------------------------------------------------------------------------------------------------


def _op_name(target: Any) -> str:
    if isinstance(target, str):
        return target
    name = str(target) if isinstance(target, torch._ops.OpOverload) else getattr(target, "__name__", str(target))
    return name[: -len(".default")] if name.endswith(".default") else name


def count_ops(graph: "torch.fx.Graph | torch.fx.GraphModule") -> Counter:
    """Operator calls of an FX graph (``call_function`` and ``call_method`` nodes), by operator name:
    e.g. ``{"aten.conv2d": 20, "aten.batch_norm": 20, ...}`` for an exported ResNet-18."""
    graph = getattr(graph, "graph", graph)
    return Counter(_op_name(n.target) for n in graph.nodes if n.op in ("call_function", "call_method"))


def graph_break_table(explain_output: Any) -> list[dict[str, Any]]:
    """One row per graph break of a ``torch._dynamo.explain(fn)(...)`` result: the reason's first line
    and the line of user code where the graph had to stop."""
    rows = []
    for reason in explain_output.break_reasons:
        frame = reason.user_stack[-1] if getattr(reason, "user_stack", None) else None
        rows.append({"reason": str(reason.reason).strip().splitlines()[0],
                     "line": frame.lineno if frame is not None else None,
                     "code": (frame.line or "").strip() if frame is not None else ""})
    return rows


_KERNEL_DEF = re.compile(r"^(\w+) = async_compile\.(?:cpp_pybinding|cpp|triton)\(", re.MULTILINE)
_TMP_LINE = re.compile(r"^\s*(?:auto\s+)?tmp\d+\s*=\s*\S")


def kernel_names(code: str) -> list[str]:
    """Names of the kernels defined in inductor's generated module (``cpp_fused_...`` on a CPU,
    ``triton_poi_fused_...`` / ``triton_red_...`` / ``triton_per_...`` on a GPU), in order, once each."""
    seen: dict[str, None] = {}
    for name in _KERNEL_DEF.findall(code):
        seen.setdefault(name, None)
    return list(seen)


def fused_lines(code: str, limit: int = 14) -> list[str]:
    """The first ``limit`` ``tmpN = ...`` lines of generated code: inside a fused kernel, every
    operation of the graph becomes one such line on values held in registers."""
    if limit < 1:
        raise ValueError(f"limit must be a positive integer, got {limit!r}")
    return [ln.strip() for ln in code.splitlines() if _TMP_LINE.match(ln)][:limit]


def _nbytes(node: Any) -> int:
    meta = getattr(node, "meta", {}).get("tensor_meta") if hasattr(node, "meta") else None
    if meta is None or not hasattr(meta, "shape"):
        return 0
    return math.prod(meta.shape) * meta.dtype.itemsize


def memory_traffic(fn: Callable[..., torch.Tensor], *example_args: torch.Tensor) -> dict[str, int]:
    """Bytes moved by ``fn`` (a chain of tensor operations) run eagerly against one fused pass.

    Eager mode runs one kernel per operation, and each reads its tensor inputs from memory and writes its
    output back. A fused kernel reads the function's inputs once and writes its output once; the
    intermediate values stay in registers. Returns ``{"ops", "eager_bytes", "fused_bytes"}``.
    """
    from torch.fx.passes.shape_prop import ShapeProp

    gm = torch.fx.symbolic_trace(fn)
    ShapeProp(gm).propagate(*example_args)
    ops = [n for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")]
    eager = sum(sum(_nbytes(a) for a in n.all_input_nodes) + _nbytes(n) for n in ops)
    inputs = sum(_nbytes(n) for n in gm.graph.nodes if n.op == "placeholder")
    outputs = sum(_nbytes(a) for n in gm.graph.nodes if n.op == "output" for a in n.all_input_nodes)
    return {"ops": len(ops), "eager_bytes": int(eager), "fused_bytes": int(inputs + outputs)}


# --------------------------------------------------------------------------------------------------
# Tidy output
# --------------------------------------------------------------------------------------------------


class _Collect(logging.Filter):
    """Keeps torch's log records below ERROR out of the output, and remembers them."""

    def __init__(self, sink: list[dict[str, str]]) -> None:
        super().__init__()
        self.sink = sink

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return True
        first = next((ln for ln in record.getMessage().splitlines() if ln.strip()), "")
        self.sink.append({"source": record.name, "category": f"log {record.levelname.lower()}",
                          "message": first.strip()})
        return False


def _torch_handlers() -> set[logging.Handler]:
    handlers: set[logging.Handler] = set()
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if (name == "torch" or name.startswith("torch.")) and isinstance(logger, logging.Logger):
            handlers.update(logger.handlers)
    return handlers


@contextlib.contextmanager
def captured_warnings(stderr: bool = False) -> Iterator[list[dict[str, str]]]:
    """Collect Python warnings and torch's warning log lines (graph breaks, recompilations) raised
    inside the block, instead of printing them. Yields a list, filled when the block ends; errors
    still show. With ``stderr=True``, text printed to ``sys.stderr`` is collected too (torch.export
    prints the partial graph of a failed export there). ``summarise_warnings(caught)`` says what was caught."""
    import io

    caught: list[dict[str, str]] = []
    flt = _Collect(caught)
    handlers = _torch_handlers()
    for h in handlers:
        h.addFilter(flt)
    records: list[warnings.WarningMessage] = []
    buffer = io.StringIO()
    try:
        with contextlib.ExitStack() as stack:
            if stderr:
                stack.enter_context(contextlib.redirect_stderr(buffer))
            records = stack.enter_context(warnings.catch_warnings(record=True))
            warnings.simplefilter("always")
            yield caught
    finally:
        for h in handlers:
            h.removeFilter(flt)
        for w in records or []:
            first = next((ln for ln in str(w.message).splitlines() if ln.strip()), "")
            caught.append({"source": "warnings", "category": w.category.__name__, "message": first.strip()})
        printed = next((ln.strip() for ln in buffer.getvalue().splitlines() if ln.strip()), "")
        if printed:
            caught.append({"source": "stderr", "category": "printed to stderr", "message": printed})


def summarise_warnings(caught: list[dict[str, str]], width: int = 160) -> list[str]:
    """One line per distinct caught warning: ``"DeprecationWarning (x2): message"``."""
    counts = Counter((c["category"], c["message"]) for c in caught)
    lines = []
    for (category, message), n in counts.items():
        text = f"{category}{f' (x{n})' if n > 1 else ''}: {message}"
        lines.append(text if len(text) <= width else text[: width - 3] + "...")
    return lines




# --------------------------------------------------------------------------------------------------
# A Triton kernel (GPU only)
# --------------------------------------------------------------------------------------------------

tl = None  # triton.language, bound by _build_bias_gelu_kernel (the kernel below looks it up here)
_BIAS_GELU_KERNEL = None
GELU_TANH_K = 2 * math.sqrt(2 / math.pi)  # 0.5 * (1 + tanh(u)) == sigmoid(2u): GELU-tanh as y * sigmoid(K * (y + 0.044715 y^3))


def _build_bias_gelu_kernel():
    global tl
    import triton
    import triton.language as _tl

    tl = _tl

    @triton.jit
    def bias_gelu_kernel(x_ptr, bias_ptr, out_ptr, n_elements, n_cols, BLOCK: tl.constexpr):
        pid = tl.program_id(axis=0)                        # which block of BLOCK elements is mine
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n_elements                           # the last block may stick out of the tensor
        x = tl.load(x_ptr + offs, mask=mask)
        b = tl.load(bias_ptr + offs % n_cols, mask=mask)   # x is [rows, n_cols], row-major
        y = x + b
        z = 1.5957691216057308 * (y + 0.044715 * y * y * y)
        tl.store(out_ptr + offs, y / (1.0 + tl.exp(-z)), mask=mask)

    return bias_gelu_kernel


def triton_bias_gelu(x: torch.Tensor, bias: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """``gelu(x + bias, approximate="tanh")`` in one Triton kernel: one read of x, one write of the result.

    ``x`` is ``[rows, cols]`` (made contiguous), ``bias`` is ``[cols]``, both float32 on a CUDA GPU.
    """
    global _BIAS_GELU_KERNEL
    if x.device.type != "cuda" or bias.device != x.device:
        raise RuntimeError(f"triton_bias_gelu needs x and bias on the same CUDA GPU (got {x.device} and {bias.device})")
    if x.ndim != 2 or bias.shape != (x.shape[1],):
        raise ValueError(f"x must be [rows, cols] and bias [cols], got {tuple(x.shape)} and {tuple(bias.shape)}")
    if block < 1 or block & (block - 1):
        raise ValueError(f"block must be a power of two, got {block}")
    if _BIAS_GELU_KERNEL is None:
        _BIAS_GELU_KERNEL = _build_bias_gelu_kernel()
    x, bias = x.contiguous(), bias.contiguous()
    out = torch.empty_like(x)
    n = x.numel()
    _BIAS_GELU_KERNEL[((n + block - 1) // block,)](x, bias, out, n, x.shape[1], BLOCK=block)
    return out
