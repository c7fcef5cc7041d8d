"""dlo.measure.attention: eager attention equals SDPA; the bytes saved for backward are counted and match the
formula (quadratic in the sequence length for eager attention, linear for a fused kernel); every refused
backend says why. Counted bytes and values only, no wall time."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dlo.measure import Measurement
from dlo.measure import attention as A

CPU_BACKENDS = A.sdpa_backends("cpu")
FUSED_HERE = [n for n in A.FUSED if CPU_BACKENDS[n] is None]


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float64, 1e-10)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads, kv_heads", [(3, 3), (4, 2), (6, 1)])
def test_eager_equals_sdpa_math_forward_and_backward(dtype, tol, causal, heads, kv_heads):
    g = torch.Generator().manual_seed(heads * 10 + kv_heads + causal)
    q, k, v = A.leaves(2, heads, 37, 24, kv_heads=kv_heads, dtype=dtype, generator=g)
    q2, k2, v2 = (t.detach().clone().requires_grad_() for t in (q, k, v))
    grad = torch.randn(q.shape, generator=g, dtype=dtype)
    out = A.eager_attention(q, k, v, causal)
    ref = A.attention_fn("math")(q2, k2, v2, causal)
    out.backward(grad)
    ref.backward(grad)
    assert torch.allclose(out, ref, atol=tol, rtol=0), float((out - ref).abs().max())
    for a, b in ((q, q2), (k, k2), (v, v2)):
        assert torch.allclose(a.grad, b.grad, atol=tol, rtol=0), float((a.grad - b.grad).abs().max())


def test_eager_causal_differs_from_non_causal_and_matches_default_sdpa():
    q, k, v = A.leaves(1, 2, 16, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert not torch.allclose(A.eager_attention(q, k, v, True), A.eager_attention(q, k, v, False))
        assert torch.allclose(A.eager_attention(q, k, v, True), F.scaled_dot_product_attention(q, k, v, is_causal=True),
                              atol=1e-5)


def test_eager_rejects_heads_not_a_multiple_of_kv_heads():
    q, k, v = A.leaves(1, 3, 8, 4, kv_heads=2)
    with pytest.raises(ValueError, match="multiple"):
        A.eager_attention(q, k, v)


@pytest.mark.parametrize("name", FUSED_HERE)
def test_fused_backends_available_here_equal_eager(name):
    q, k, v = A.leaves(2, 3, 40, 16, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        for causal in (False, True):
            assert torch.allclose(A.attention_fn(name)(q, k, v, causal), A.eager_attention(q, k, v, causal), atol=1e-5)


def test_sdpa_backends_runs_math_and_gives_a_reason_for_each_refusal():
    assert set(CPU_BACKENDS) == {"math", "efficient", "flash", "cudnn"}
    assert CPU_BACKENDS["math"] is None
    for name, reason in CPU_BACKENDS.items():
        if reason is not None:
            assert isinstance(reason, str) and reason and "\n" not in reason and "cpu" in reason, (name, reason)
    # CUDA-only kernels cannot run on a CPU
    assert CPU_BACKENDS["cudnn"] is not None


def test_attention_fn_rejects_unknown_names():
    with pytest.raises(ValueError, match="unknown attention 'flashy'"):
        A.attention_fn("flashy")


@pytest.mark.parametrize("causal", [False, True])
def test_eager_saved_bytes_equal_the_formula_and_grow_4x_when_s_doubles(causal):
    b, h, d = 2, 3, 8
    measured = {}
    for s in (256, 512, 1024):
        q, k, v = A.leaves(b, h, s, d)
        measured[s] = A.attention_memory(A.eager_attention, q, k, v, causal)["saved_bytes"]
        assert measured[s] == A.saved_bytes_formula(b, h, s, d, fused=False, mask_bytes=s * s if causal else 0)
    growth = A.growth(measured)
    assert 3.8 < growth[1024] <= 4.0 and growth[512] < growth[1024]  # tends to 4: the S² term dominates
    # the S² term exactly: the linear part (Q, K, V) doubles with S, so bytes(2S) - 2 bytes(S) leaves
    # quad(2S) - 2 quad(S) = 2 quad(S), with quad(S) = batch·heads·S²·4 (+ the S² bytes of the causal mask)
    quad = {s: b * h * s * s * 4 + (s * s if causal else 0) for s in measured}
    assert measured[1024] - 2 * measured[512] == 2 * quad[512]


def test_eager_saved_bytes_with_grouped_kv_count_the_repeated_heads():
    q, k, v = A.leaves(1, 4, 64, 8, kv_heads=2)
    got = A.attention_memory(A.eager_attention, q, k, v)["saved_bytes"]
    assert got == A.saved_bytes_formula(1, 4, 64, 8, fused=False)


def test_math_backend_saves_the_s2_matrix_too():
    q, k, v = A.leaves(2, 3, 256, 8)
    got = A.attention_memory(A.attention_fn("math"), q, k, v, True)["saved_bytes"]
    assert got == A.saved_bytes_formula(2, 3, 256, 8, fused=False)


@pytest.mark.parametrize("name", FUSED_HERE or [pytest.param("flash", marks=pytest.mark.skip("no fused CPU kernel"))])
@pytest.mark.parametrize("causal", [False, True])
def test_fused_saved_bytes_equal_the_formula_and_grow_2x_when_s_doubles(name, causal):
    b, h, d = 2, 3, 8
    measured = {}
    for s in (256, 512, 1024):
        q, k, v = A.leaves(b, h, s, d)
        measured[s] = A.attention_memory(A.attention_fn(name), q, k, v, causal)["saved_bytes"]
        assert measured[s] == A.saved_bytes_formula(b, h, s, d, fused=True)
    assert A.growth(measured) == {512: 2.0, 1024: 2.0}


def test_saved_bytes_formula_terms():
    assert A.saved_bytes_formula(1, 1, 10, 2, fused=True) == 4 * (3 * 20 + 20 + 10)
    assert A.saved_bytes_formula(1, 1, 10, 2, fused=False, dtype_bytes=2, mask_bytes=100) == 2 * (3 * 20 + 100) + 100
    assert A.saved_bytes_formula(1, 4, 10, 2, fused=True, kv_heads=1) == 4 * (4 * 20 + 2 * 20 + 4 * 20 + 40)


def test_attention_memory_counts_a_storage_once_and_has_no_peak_on_cpu():
    def twice(q, k, v, causal):  # saves q twice (two views of one storage) and k once
        return (q * k).sum(-1, keepdim=True) * q.transpose(-1, -2).transpose(-1, -2)
    q, k, v = A.leaves(1, 1, 4, 2)
    mem = A.attention_memory(twice, q, k, v)
    assert mem["peak_bytes"] is None
    # saved: q, k (by q*k), the sum (by the second mul) and q's view: 3 storages
    assert mem["saved_bytes"] == 4 * (8 + 8 + 4 + 0)


def test_time_attention_measures_every_name_interleaved_with_a_fake_clock():
    calls = []

    def timer(fn):
        fn()
        calls.append(1)
        return 0.01
    q, k, v = A.leaves(1, 2, 32, 8)
    m = A.time_attention(["eager", "math"], q, k, v, causal=True, repeats=3, warmup=1, timer=timer, heads=2)
    assert list(m) == ["eager", "math"] and all(isinstance(x, Measurement) for x in m.values())
    assert len(calls) == 2 * (1 + 3)
    assert m["eager"].items_per_call == 32 and m["eager"].unit == "tok/s"
    assert m["math"].extra == {"attention": "math", "seq": 32, "causal": True, "heads": 2}
    assert q.grad is not None and k.grad is not None


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_eager_saves_half_sized_probabilities_and_math_saves_them_in_fp32_on_cpu(dtype):
    """In 16-bit, eager attention keeps 2-byte probabilities; SDPA's math backend computes (and saves) in fp32 on
    a CPU, so it keeps twice the bytes of the 16-bit formula: the notebook's 'measured / formula' of 2."""
    b, h, s, d = 1, 2, 128, 16
    q, k, v = A.leaves(b, h, s, d, dtype=dtype)
    eager = A.attention_memory(A.eager_attention, q, k, v)["saved_bytes"]
    assert eager == A.saved_bytes_formula(b, h, s, d, dtype_bytes=2, fused=False)
    math_bytes = A.attention_memory(A.attention_fn("math"), q, k, v)["saved_bytes"]
    assert math_bytes == A.saved_bytes_formula(b, h, s, d, dtype_bytes=4, fused=False)
