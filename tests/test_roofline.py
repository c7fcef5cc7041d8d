"""dlo.measure.roofline: arithmetic intensity, the roofline model, measured sweeps and the profile classifier."""
from __future__ import annotations

import math

import pytest
import torch

import dlo  # noqa: F401
from dlo.measure import roofline as rl
from dlo.measure.flops import GPU_PEAKS, TERA


def test_matmul_flops_bytes_and_intensity():
    assert rl.matmul_flops(2, 3, 4) == 48
    assert rl.matmul_bytes(2, 3, 4, torch.float32) == (8 + 12 + 6) * 4
    assert rl.matmul_bytes(2, 3, 4, torch.bfloat16) == (8 + 12 + 6) * 2
    for n in (1, 64, 1000):  # square: 2n / (3b)
        assert rl.arithmetic_intensity(n, n, n, torch.float32) == pytest.approx(2 * n / 12)
        assert rl.arithmetic_intensity(n, n, n, torch.bfloat16) == pytest.approx(2 * n / 6)
    assert rl.arithmetic_intensity(4096, 1, 4096, 2) < 1.1  # a matrix-vector product is memory-bound
    with pytest.raises(ValueError, match="positive integer"):
        rl.matmul_flops(0, 2, 2)
    with pytest.raises(ValueError, match="unknown dtype"):
        rl.dtype_bytes(torch.complex64)


def test_roofline_bound_and_knee():
    peak, bw = 100e12, 2e12
    assert rl.knee(peak, bw) == 50
    assert rl.attainable(10, peak, bw) == 20e12  # memory roof
    assert rl.attainable(50, peak, bw) == peak  # the knee: both roofs meet
    assert rl.attainable(1000, peak, bw) == peak  # compute roof
    assert rl.attainable([1, 100], peak, bw) == [2e12, peak]
    with pytest.raises(ValueError, match="positive"):
        rl.knee(0, bw)
    with pytest.raises(ValueError, match=">= 0"):
        rl.attainable(-1, peak, bw)


def test_reference_figures_come_from_the_shared_table():
    peak, bw = rl.spec_roofline("H100", "bf16")
    assert peak == GPU_PEAKS["H100"].bf16_tflops * TERA and bw == GPU_PEAKS["H100"].hbm_tb_s * TERA
    assert rl.spec_roofline("NVIDIA H200", "fp32")[1] == 4.8e12
    assert rl.knee(*rl.spec_roofline("A100", "bf16")) == pytest.approx(156.0)
    table = rl.reference_table()
    assert list(table["gpu"]) == [s.name for s in GPU_PEAKS.values()]
    row = table[table["gpu"] == "H100 SXM"].iloc[0]
    assert row["knee bf16 (FLOP/B)"] == pytest.approx(989 / 3.35, abs=0.05)
    n = row["square matmul n at bf16 knee"]
    assert rl.arithmetic_intensity(n, n, n, 2) >= 989 / 3.35 > rl.arithmetic_intensity(n - 1, n - 1, n - 1, 2)
    with pytest.raises(ValueError, match="no tf32 peak"):
        rl.spec_roofline("V100", "tf32")
    with pytest.raises(ValueError, match="no reference figures"):
        rl.spec_roofline("MI300X")
    assert rl.device_reference("cpu") is None


def test_measure_matmul_and_bandwidth_records():
    recs = rl.measure_matmul([16, (8, 4, 2)], warmup=1, repeats=3, min_seconds=1e-3)
    assert [(r["m"], r["n"], r["k"]) for r in recs] == [(16, 16, 16), (8, 4, 2)]
    for r in recs:
        assert r["median_s"] > 0 and r["inner_calls"] >= 1
        assert r["tflops"] == pytest.approx(r["flops"] / r["median_s"] / TERA)
        assert r["intensity"] == pytest.approx(rl.arithmetic_intensity(r["m"], r["n"], r["k"], 4))
    bw = rl.measure_bandwidth(nbytes=1 << 20, repeats=3)
    assert bw["bytes_moved"] == 2 * (1 << 20) and bw["bandwidth"] == pytest.approx(bw["bytes_moved"] / bw["median_s"])
    roof = rl.measured_roofline(recs, bw)
    assert roof["knee"] == pytest.approx(roof["peak_flops"] / roof["bandwidth"])
    with pytest.raises(ValueError, match="nbytes"):
        rl.measure_bandwidth(nbytes=10)
    with pytest.raises(ValueError, match="at least one size"):
        rl.measure_matmul([])


@pytest.mark.parametrize("name, kind", [
    ("aten::mkldnn_convolution", "compute-bound"), ("aten::convolution_backward", "compute-bound"),
    ("aten::cudnn_convolution", "compute-bound"), ("aten::addmm", "compute-bound"), ("aten::mm", "compute-bound"),
    ("aten::bmm", "compute-bound"), ("aten::native_batch_norm", "memory-bound"),
    ("aten::native_batch_norm_backward", "memory-bound"), ("aten::relu_", "memory-bound"),
    ("aten::threshold_backward", "memory-bound"), ("aten::max_pool2d_with_indices", "memory-bound"),
    ("aten::add_", "memory-bound"), ("aten::copy_", "memory-bound"), ("aten::view", "overhead"),
    ("aten::empty", "overhead"), ("ConvolutionBackward0", "overhead"), ("torch::autograd::AccumulateGrad", "overhead"),
    ("aten::sum", "memory-bound"), ("aten::_foreach_add_", "memory-bound"), ("aten::mean", "memory-bound"),
    ("Optimizer.step#SGD.step", "overhead"),
])
def test_op_kind_rule(name, kind):
    assert rl.op_kind(name) == kind


def test_classify_a_profile_of_the_resnet():
    from torch.profiler import ProfilerActivity, profile

    from dlo.models import resnet18_cifar

    torch.manual_seed(0)
    model = resnet18_cifar(width=8)
    x = torch.randn(8, 3, 32, 32)
    with profile(activities=[ProfilerActivity.CPU], with_flops=True) as prof:
        model(x).sum().backward()
    ops = rl.classify_ops(prof)
    assert ops["self_ms"].is_monotonic_decreasing and ops["share"].sum() == pytest.approx(1.0)
    assert set(ops["kind"]) <= {"compute-bound", "memory-bound", "overhead"}
    names = set(ops["op"])
    assert "aten::native_batch_norm" in names and ops.set_index("op").loc["aten::native_batch_norm", "kind"] == "memory-bound"
    assert (ops[ops["kind"] == "compute-bound"]["op"].str.contains("conv")).any()
    assert ops["flops"].fillna(0).sum() > 0  # with_flops counts the convolutions
    shares = rl.time_by_kind(ops)
    assert sum(shares.values()) == pytest.approx(1.0) and shares["memory-bound"] > 0
    assert len(rl.classify_ops(prof, top=3)) == 3
    with pytest.raises(ValueError, match="device_type"):
        rl.classify_ops(prof, device_type="tpu")
    with pytest.raises(ValueError, match="no timed operators"):
        rl.classify_ops([])


def test_padding_and_waves():
    assert rl.pad_to_multiple(50257, 64) == 50304
    assert rl.pad_to_multiple(64, 64) == 64 and rl.pad_to_multiple(3, 4) == 4 and rl.pad_to_multiple(1, 8) == 8
    with pytest.raises(ValueError, match="positive integer"):
        rl.pad_to_multiple(0, 8)
    x = torch.randn(2, 3, 5, 5).contiguous(memory_format=torch.channels_last)
    p = rl.pad_channels(x, 4)
    assert p.shape == (2, 4, 5, 5) and torch.equal(p[:, :3], x) and not p[:, 3].any()
    assert p.is_contiguous(memory_format=torch.channels_last)
    conv3 = torch.nn.Conv2d(3, 8, 3, padding=1, bias=False)
    conv4 = torch.nn.Conv2d(4, 8, 3, padding=1, bias=False)
    with torch.no_grad():  # zero weights on the padded channel: the same convolution
        conv4.weight.zero_()
        conv4.weight[:, :3] = conv3.weight
        assert torch.allclose(conv4(p), conv3(x), atol=1e-6)
    assert rl.pad_channels(p, 4) is p
    with pytest.raises(ValueError, match="NCHW"):
        rl.pad_channels(torch.zeros(3, 4, 4))
    assert rl.waves(128 * 132, 128, 132) == 1.0
    assert rl.waves(128 * 132 + 1, 128, 132) == pytest.approx(133 / 132)
    assert math.ceil(rl.waves(128 * 132 + 1, 128, 132)) == 2


def test_classify_a_cpu_profile_by_device_time_says_what_to_do():
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.ones(64, 64) @ torch.ones(64, 64)
    with pytest.raises(ValueError, match="ProfilerActivity.CUDA"):
        rl.classify_ops(prof, device_type="cuda")  # no GPU time in a CPU-only profile
