"""gpu-check's 1F1B target: the gap of the measured bubble to theory is judged on both sides."""
from __future__ import annotations

import pytest

import dlo  # noqa: F401
from dlo.course import gpu_benchmarks as gb
from dlo.course import gpu_check as gc

PIPELINE = next(b for b in gc.BENCHMARKS if b.parse is gb._pipeline_parse)


def _run(bubble, theory=0.25):
    return [{"kind": "pipeline", "schedule": "1f1b", "bubble": bubble, "bubble_theory": theory, "rank": 0}]


@pytest.mark.parametrize("bubble, verdict, side", [
    (0.27, "met", "above theory"),      # +8 %
    (0.24, "met", "below theory"),      # -4 %: within the noise
    (0.30, "MISSED", "above theory"),   # +20 %
    (0.05, "MISSED", "below theory"),   # -80 %: a bubble no 1F1B of equal stages can have
    (0.0, "MISSED", "below theory"),
])
def test_a_bubble_far_below_theory_is_not_met(tmp_path, bubble, verdict, side):
    value, details = gb._pipeline_parse(tmp_path, _run(bubble))
    assert value == pytest.approx(abs(bubble - 0.25) / 0.25 * 100) and value >= 0
    assert details["side"] == side and details["gap_signed_pct"] == pytest.approx((bubble - 0.25) / 0.25 * 100)
    assert gc.verdict(PIPELINE, value, details, dry=False) == verdict
    assert ("note" in details) == (bubble < 0.25 * 0.85)


def test_no_bubble_in_theory_is_no_value_not_a_division_by_zero(tmp_path):
    value, details = gb._pipeline_parse(tmp_path, _run(0.1, theory=0.0))
    assert value is None and "no bubble in theory" in details["why"]
