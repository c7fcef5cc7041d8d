"""Tests of dlo.lessons.jit: break-even arithmetic and plot, first-call timing, graph/code readers, memory
traffic, warning capture, and the Triton helper's CPU behaviour."""
from __future__ import annotations

import inspect
import logging
import math
import sys
import time
import warnings

import matplotlib

matplotlib.use("Agg")

import pytest
import torch
import torch.nn.functional as F

import dlo  # noqa: F401  (before torchvision: prepares its import)
from dlo.runtime.errors import first_line
from dlo.lessons import jit


# ----------------------------------------------------------------------------------------- break-even

def test_break_even_is_compile_time_over_time_saved_per_step():
    assert jit.break_even_steps(10.0, 0.005, 0.003) == pytest.approx(5000.0)
    n = jit.break_even_steps(3.0, 0.2, 0.1)
    assert 3.0 + n * 0.1 == pytest.approx(n * 0.2)  # both lines meet there
    assert jit.break_even_steps(0.0, 0.2, 0.1) == 0.0


@pytest.mark.parametrize("compiled", [0.2, 0.25])
def test_break_even_never_when_compiled_is_not_faster(compiled):
    assert jit.break_even_steps(5.0, 0.2, compiled) == math.inf
    assert jit.describe_steps(jit.break_even_steps(5.0, 0.2, compiled)) == "never"


@pytest.mark.parametrize("args, name", [((-1.0, 0.1, 0.05), "compile_s"), ((1.0, 0.0, 0.05), "eager_step_s"),
                                        ((1.0, 0.1, float("nan")), "compiled_step_s"), (("x", 0.1, 0.05), "compile_s"),
                                        ((1.0, 0.1, -0.05), "compiled_step_s"), ((math.inf, 0.1, 0.05), "compile_s")])
def test_break_even_rejects_bad_times_in_one_line(args, name):
    with pytest.raises(ValueError, match=name) as info:
        jit.break_even_steps(*args)
    assert "\n" not in str(info.value)


def test_describe_steps_rounds_up_to_whole_steps():
    assert jit.describe_steps(1.0) == "1 step"
    assert jit.describe_steps(1.2) == "2 steps"
    assert jit.describe_steps(12345.01) == "12,346 steps"


def test_plot_break_even_draws_both_lines_and_marks_the_crossing(tmp_path):
    fig = jit.plot_break_even(10.0, 0.005, 0.003, path=tmp_path / "be.png")
    ax = fig.axes[0]
    assert (tmp_path / "be.png").is_file()
    assert ax.get_xlim()[1] == pytest.approx(10000)  # twice the break-even
    vlines = [ln for ln in ax.lines if len(set(ln.get_xdata())) == 1 and ln.get_xdata()[0] == pytest.approx(5000)]
    assert vlines, "the break-even is marked by a vertical line"
    assert any("5,000 steps" in t.get_text() for t in ax.texts)
    eager, compiled = ax.lines[0], ax.lines[1]
    assert eager.get_ydata()[-1] == pytest.approx(10000 * 0.005)
    assert compiled.get_ydata()[0] == pytest.approx(10.0)


def test_plot_break_even_never_says_so():
    fig = jit.plot_break_even(4.0, 0.1, 0.2)
    ax = fig.axes[0]
    assert any("never" in t.get_text() for t in ax.texts)
    assert ax.get_xlim()[1] == pytest.approx(80)  # far enough for the 4 s head start to show
    with pytest.raises(ValueError, match="max_steps"):
        jit.plot_break_even(4.0, 0.1, 0.05, max_steps=0)


# ----------------------------------------------------------------------------------------- timing

def test_first_and_steady_separates_the_first_call():
    calls = []

    def fn():
        calls.append(1)
        time.sleep(0.08 if len(calls) == 1 else 0.001)

    r = jit.first_and_steady(fn, warmup=2, repeats=5)
    assert len(calls) == 1 + 2 + 5
    assert r.first_call_s >= 0.08 and r.median_s < 0.03
    assert r.overhead_s == pytest.approx(r.first_call_s - r.median_s)
    rec = r.to_record()
    assert rec["repeats"] == 5 and rec["warmup"] == 2 and len(rec["times_s"]) == 5


def test_overhead_is_never_negative():
    r = jit.FirstAndSteady(first_call_s=0.001, times_s=[0.002, 0.003], warmup=0)
    assert r.overhead_s == 0.0


def test_time_first_call_returns_the_output():
    seconds, out = jit.time_first_call(lambda: 41 + 1)
    assert out == 42 and seconds >= 0


# ----------------------------------------------------------------------------------------- graphs and code

class _Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, x):
        return torch.relu(self.lin(x)) + 1


def test_count_ops_on_an_exported_program():
    ep = torch.export.export(_Tiny(), (torch.randn(2, 4),))
    ops = jit.count_ops(ep.graph_module)
    assert ops["aten.linear"] == 1 and ops["aten.relu"] == 1 and ops["aten.add.Tensor"] == 1
    assert sum(ops.values()) == 3
    assert jit.count_ops(ep.graph_module.graph) == ops


def test_count_ops_names_python_functions_and_methods():
    gm = torch.fx.symbolic_trace(lambda x: torch.sigmoid(x).sum())
    assert jit.count_ops(gm) == {"sigmoid": 1, "sum": 1}


def _with_item_break(x):
    norm = x.norm()
    if norm.item() > 1.0:
        return x / norm
    return x


def _without_break(x):
    return x / torch.clamp(x.norm(), min=1.0)


def test_graph_break_table_points_at_the_line():
    rows = jit.graph_break_table(torch._dynamo.explain(_with_item_break)(torch.randn(20) * 5))
    assert len(rows) == 1
    assert "item" in rows[0]["reason"].lower() and ".item()" in rows[0]["code"]
    assert rows[0]["line"] == inspect.getsourcelines(_with_item_break)[1] + 2
    assert jit.graph_break_table(torch._dynamo.explain(_without_break)(torch.randn(20))) == []


CPU_CODE = '''
cpp_fused_add_mul_sigmoid_0 = async_compile.cpp_pybinding(['const float*', 'float*'], r"""
extern "C" void kernel(const float* in_ptr0, float* out_ptr0)
{
    auto tmp0 = at::vec::Vectorized<float>::loadu(in_ptr0 + x0, 8);
    auto tmp1 = tmp0 * tmp0;
    tmp1.store(out_ptr0 + x0);
}
""")
cpp_fused_sum_1 = async_compile.cpp_pybinding(['const float*'], r"""...""")
async_compile.wait(globals())
'''
GPU_CODE = """
triton_poi_fused_add_mul_0 = async_compile.triton('triton_poi_fused_add_mul_0', '''
def triton_poi_fused_add_mul_0(in_ptr0, out_ptr0, xnumel, XBLOCK : tl.constexpr):
    tmp0 = tl.load(in_ptr0 + (x0), xmask)
    tmp1 = tmp0 + tmp0
    tl.store(out_ptr0 + (x0), tmp1, xmask)
''', device_str='cuda')
"""


def test_kernel_names_and_fused_lines():
    assert jit.kernel_names(CPU_CODE) == ["cpp_fused_add_mul_sigmoid_0", "cpp_fused_sum_1"]
    assert jit.kernel_names(GPU_CODE) == ["triton_poi_fused_add_mul_0"]
    assert jit.kernel_names("print('no kernels')") == []
    assert jit.fused_lines(CPU_CODE) == ["auto tmp0 = at::vec::Vectorized<float>::loadu(in_ptr0 + x0, 8);",
                                         "auto tmp1 = tmp0 * tmp0;"]
    assert jit.fused_lines(GPU_CODE, limit=1) == ["tmp0 = tl.load(in_ptr0 + (x0), xmask)"]
    with pytest.raises(ValueError, match="limit"):
        jit.fused_lines(CPU_CODE, limit=0)


def test_memory_traffic_counts_every_eager_read_and_write():
    x = torch.randn(1000)
    t = jit.memory_traffic(lambda x: (x + 1) * 2, x)
    # add: read x, write tmp; mul: read tmp, write out -> 4 passes eagerly, 2 when fused
    assert t == {"ops": 2, "eager_bytes": 4 * 4000, "fused_bytes": 2 * 4000}
    b = torch.randn(10)
    t = jit.memory_traffic(lambda x, b: torch.sigmoid(x + b), torch.randn(100, 10), b)
    assert t == {"ops": 2, "eager_bytes": (4000 + 40 + 4000) + (4000 + 4000), "fused_bytes": 4000 + 40 + 4000}


# ----------------------------------------------------------------------------------------- warnings

class _ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def torch_log():
    """A handler on torch._dynamo, like the one torch installs: what reaches it would be printed."""
    logger, handler = logging.getLogger("torch._dynamo"), _ListHandler()
    logger.addHandler(handler)
    yield logging.getLogger("torch._dynamo.dlo_test"), handler
    logger.removeHandler(handler)


def test_captured_warnings_keeps_output_tidy(torch_log):
    log, printed = torch_log
    with jit.captured_warnings() as caught:
        warnings.warn("`torch.jit.script` is deprecated. Please switch to `torch.compile`.", DeprecationWarning)
        warnings.warn("`torch.jit.script` is deprecated. Please switch to `torch.compile`.", DeprecationWarning)
        log.warning("Graph break from `Tensor.item()`, consider setting:\n    more detail")
    assert printed.messages == []
    assert {"source": "torch._dynamo.dlo_test", "category": "log warning",
            "message": "Graph break from `Tensor.item()`, consider setting:"} in caught
    lines = jit.summarise_warnings(caught)
    assert "DeprecationWarning (x2): `torch.jit.script` is deprecated. Please switch to `torch.compile`." in lines
    assert len(lines) == 2
    assert all(flt.__class__.__name__ != "_Collect" for h in jit._torch_handlers() for flt in h.filters)
    log.warning("after the block")
    assert printed.messages == ["after the block"]


def test_captured_warnings_lets_errors_through(torch_log):
    log, printed = torch_log
    with jit.captured_warnings() as caught:
        log.error("a real error")
    assert printed.messages == ["a real error"] and caught == []


def test_summarise_and_first_line_cut_long_text():
    long = [{"category": "UserWarning", "message": "x" * 500, "source": "warnings"}]
    assert len(jit.summarise_warnings(long, width=50)[0]) == 50
    assert first_line(ValueError("first\nsecond")) == "ValueError: first"
    assert first_line(KeyError()) == "KeyError"
    assert len(first_line(RuntimeError("y" * 400), width=40)) == 40


# ----------------------------------------------------------------------------------------- Triton helper

def test_gelu_constant_of_the_triton_kernel():
    assert jit.GELU_TANH_K == pytest.approx(1.5957691216057308, abs=1e-15)
    assert repr(jit.GELU_TANH_K) in inspect.getsource(jit._build_bias_gelu_kernel)
    y = torch.linspace(-6, 6, 1001, dtype=torch.float64)
    formula = y * torch.sigmoid(jit.GELU_TANH_K * (y + 0.044715 * y**3))
    torch.testing.assert_close(formula, F.gelu(y, approximate="tanh"))


def test_triton_bias_gelu_refuses_cpu_tensors_without_importing_triton():
    had_triton = "triton" in sys.modules
    with pytest.raises(RuntimeError, match="CUDA GPU"):
        jit.triton_bias_gelu(torch.randn(4, 8), torch.randn(8))
    assert ("triton" in sys.modules) == had_triton


def test_branchy_takes_the_branch_of_its_data():
    assert jit.branchy(torch.tensor([1.0, 2.0])).tolist() == [2.0, 4.0]
    assert jit.branchy(torch.tensor([-1.0, -2.0])).tolist() == [-2.0, -3.0]


def test_captured_warnings_can_collect_stderr(capfd):
    import sys

    with jit.captured_warnings(stderr=True) as caught:
        print("\n\ndef forward(self, x):\n    partial graph", file=sys.stderr)
    assert "partial graph" not in capfd.readouterr().err
    assert caught == [{"source": "stderr", "category": "printed to stderr", "message": "def forward(self, x):"}]
    with jit.captured_warnings() as caught:
        print("still shown", file=sys.stderr)
    assert "still shown" in capfd.readouterr().err and caught == []


def test_time_interleaved_alternates_and_drops_warmup():
    order = []
    fns = {"a": lambda: order.append("a"), "b": lambda: (order.append("b"), time.sleep(0.01))}
    times = jit.time_interleaved(fns, warmup=1, repeats=3)
    assert order == ["a", "b"] * 4
    assert set(times) == {"a", "b"} and len(times["a"]) == len(times["b"]) == 3
    assert min(times["b"]) >= 0.01 > max(times["a"])
    with pytest.raises(ValueError, match="at least one"):
        jit.time_interleaved({})
    with pytest.raises(ValueError, match="repeats"):
        jit.time_interleaved(fns, repeats=0)
