"""The bit-field figure of Jour 1 draws the widths, range and precision that torch.finfo gives for each dtype."""
from __future__ import annotations

import math

import matplotlib
import pytest
import torch

matplotlib.use("Agg")

from dlo.lessons.figures import precision  # noqa: E402
from dlo.lessons.figures.style import drawn  # noqa: E402


@pytest.mark.parametrize("dtypes", [precision.DTYPES, (torch.bfloat16, torch.float16), (torch.float64, torch.float32)])
def test_the_drawn_fields_are_finfo_s(dtypes):
    fig = precision.bits_figure(dtypes)
    boxes = [d["tag"] for d in drawn(fig, "box")]
    want = []
    for dt in dtypes:
        info = torch.finfo(dt)
        mantissa = round(-math.log2(info.eps))
        exponent = info.bits - 1 - mantissa
        # the exponent width gives the range: the largest value is (2 - eps) x 2**(2**(exponent-1) - 1)
        assert info.max == pytest.approx((2 - info.eps) * 2.0 ** (2 ** (exponent - 1) - 1), rel=1e-6)
        name = precision.fields(dt)["name"]
        want += [(name, "sign", 1), (name, "exponent", exponent), (name, "mantissa", mantissa)]
    assert boxes == want
    # each box is as wide as its bits, on one scale
    widths = {(d["tag"][0], d["tag"][1]): d["w"] / d["tag"][2] for d in drawn(fig, "box")}
    assert max(widths.values()) == pytest.approx(min(widths.values()))
    labels = " ".join(d["text"] for d in drawn(fig, "label"))
    for dt in dtypes:
        assert f"eps {torch.finfo(dt).eps:.3g}" in labels and f"max {torch.finfo(dt).max:.3g}" in labels


def test_bf16_keeps_fp32_s_range_and_fp16_does_not():
    f32, b16, f16 = (precision.fields(d) for d in precision.DTYPES)
    assert (f32["exponent"], b16["exponent"], f16["exponent"]) == (8, 8, 5)
    assert (f32["mantissa"], b16["mantissa"], f16["mantissa"]) == (23, 7, 10)
