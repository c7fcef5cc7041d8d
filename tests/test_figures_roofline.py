"""The roofline sketch is drawn from the numbers the shapes notebook computes: its ridge is the knee P / W of the
peak and bandwidth it is given, and every kernel sits left of it exactly when its intensity is below the knee."""
from __future__ import annotations

import math

import matplotlib
import pytest
import torch

matplotlib.use("Agg")

from dlo.lessons.figures.roofline import matmul_points, roofline_sketch  # noqa: E402
from dlo.lessons.figures.style import drawn  # noqa: E402
from dlo.measure import roofline as rl  # noqa: E402


@pytest.mark.parametrize("gpu, precision, dtype", [("H100", "bf16", torch.bfloat16), ("A100", "bf16", torch.bfloat16),
                                                   ("H100", "fp32", torch.float32)])
def test_the_drawn_ridge_is_the_computed_knee_and_points_fall_on_its_sides(gpu, precision, dtype):
    peak, bw = rl.spec_roofline(gpu, precision)
    points = matmul_points((64, 1024, 8192), dtype, matvec=8192)
    fig = roofline_sketch(peak, bw, points, name=f"{gpu} {precision}")
    [ridge] = drawn(fig, "ridge")
    assert math.isclose(ridge["intensity"], rl.knee(peak, bw))
    drawn_points = drawn(fig, "point")
    assert {p["text"]: p["intensity"] for p in drawn_points} == points
    for p in drawn_points:
        assert (p["x"] < ridge["x"]) == (p["intensity"] < rl.knee(peak, bw))
        assert p["bound"] == ("memory-bound" if p["intensity"] < rl.knee(peak, bw) else "compute-bound")
    assert points["matmul n = 64"] == rl.arithmetic_intensity(64, 64, 64, dtype)
    matplotlib.pyplot.close(fig)


def test_a_measured_cpu_roofline_and_a_png(tmp_path):
    fig = roofline_sketch(2e11, 1e10, {"a": 0.5, "b": 400.0}, path=tmp_path / "r.png")
    [ridge] = drawn(fig, "ridge")
    assert ridge["intensity"] == pytest.approx(20.0)
    assert [p["bound"] for p in drawn(fig, "point")] == ["memory-bound", "compute-bound"]
    assert (tmp_path / "r.png").stat().st_size > 0
    matplotlib.pyplot.close(fig)
