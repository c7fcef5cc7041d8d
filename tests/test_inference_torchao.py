"""torchao's int8 dynamic quantization, as Jour4/inference.ipynb teaches it on the CPU: quantize_ works in place,
the int8 weights make the serialized model about four times smaller (measured outside inference mode, where
torchao's weights cannot be serialized), and the predictions stay close to the fp32 model's."""
from __future__ import annotations

import copy
import logging

import pytest
import torch

from dlo.lessons import inference as infer
from dlo.models import small


def _torchao_quantization():
    logging.getLogger("torchao").setLevel(logging.ERROR)  # its notes on GPU kernels this machine cannot load
    return pytest.importorskip("torchao.quantization")


def test_int8_dynamic_quantization_in_place_is_four_times_smaller_and_close():
    tq = _torchao_quantization()
    torch.manual_seed(0)
    m = small.MLP(in_features=256, hidden=(512,), num_classes=10).eval()
    q = copy.deepcopy(m)
    assert tq.quantize_(q, tq.Int8DynamicActivationInt8WeightConfig()) is None  # in place
    assert q[1].weight.qdata.dtype == torch.int8 and m[1].weight.dtype == torch.float32
    ratio = infer.model_size_bytes(m) / infer.model_size_bytes(q)
    assert 3.5 < ratio < 4.1
    x = torch.randn(64, 256)
    with torch.inference_mode():
        ref, out = m(x), q(x)
    assert (ref - out).abs().max() < 0.05 * ref.abs().max()
    assert (ref.argmax(1) == out.argmax(1)).float().mean() > 0.9
    # the rounding bound the notebook prints: at most half a scale per weight
    w = q[1].weight
    assert (w.dequantize().float() - m[1].weight).abs().max() <= w.scale.max() / 2 * 1.001
