"""Tests of dlo.lessons.inference: the distillation loss, model sizes, quantization, pruning and sparsity, the KV cache."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import prune

import dlo  # noqa: F401  (before torchvision / transformers)
from dlo.lessons import inference as infer
from dlo.models.config import TINY_LLAMA
from dlo.models import small

MICRO_LLAMA = TINY_LLAMA.replace(vocab_size=128, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                                 num_kv_heads=2, head_dim=16, name="micro Llama")


# --------------------------------------------------------------------------------------------------
# Distillation
# --------------------------------------------------------------------------------------------------

def _logits(seed=0, n=8, k=10):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=g) * 2, torch.randn(n, k, generator=g) * 2, torch.randint(0, k, (n,), generator=g)


@pytest.mark.parametrize("T", [1.0, 2.0, 5.0])
@pytest.mark.parametrize("alpha", [0.0, 0.3, 1.0])
def test_distillation_loss_is_the_written_formula(T, alpha):
    s, t, y = _logits()
    p_t = F.softmax(t / T, -1)
    kl = (p_t * (p_t.log() - F.log_softmax(s / T, -1))).sum(-1).mean()  # KL(teacher ‖ student), mean over the batch
    want = alpha * T**2 * kl + (1 - alpha) * F.cross_entropy(s, y)
    assert torch.allclose(infer.distillation_loss(s, t, y, T, alpha), want, atol=1e-5)


def test_distillation_soft_term_vanishes_when_the_student_matches_the_teacher():
    s, _, y = _logits()
    assert infer.distillation_loss(s, s.clone(), y, T=3.0, alpha=1.0).abs() < 1e-6


def test_t_squared_keeps_the_soft_gradient_scale():
    """Without T², the soft term's gradient shrinks like 1/T²; with it, it stays of the same order."""
    s, t, y = _logits(1, n=64)
    norms = {}
    for T in (1.0, 10.0):
        x = s.clone().requires_grad_(True)
        infer.distillation_loss(x, t, y, T=T, alpha=1.0).backward()
        norms[T] = x.grad.norm().item()
    assert 0.1 < norms[10.0] / norms[1.0] < 3  # with the factor; without it the ratio would be ~1/100


def test_distillation_does_not_train_the_teacher():
    s, t, y = _logits()
    s.requires_grad_(True)
    t.requires_grad_(True)
    infer.distillation_loss(s, t, y).backward()
    assert t.grad is None and s.grad is not None


@pytest.mark.parametrize("kwargs, message", [({"T": 0.0}, "temperature"), ({"alpha": 1.5}, "alpha")])
def test_distillation_loss_rejects_bad_settings(kwargs, message):
    s, t, y = _logits()
    with pytest.raises(ValueError, match=message):
        infer.distillation_loss(s, t, y, **kwargs)


def test_student_models_are_small_and_classify():
    cnn, mlp = small.SmallCNN(8), small.MLP(hidden=(64,))
    x = torch.randn(2, 3, 32, 32)
    assert cnn(x).shape == mlp(x).shape == (2, 10)
    assert sum(p.numel() for p in cnn.parameters()) < 10_000


def test_fit_classifier_passes_index_and_flip_to_the_loss():
    x = torch.randn(64, 3, 4, 4)
    y = torch.arange(64) % 10
    torch.manual_seed(0)
    model = small.MLP(in_features=48, hidden=(8,))
    table = infer.teacher_logits_table(model, x)
    assert torch.allclose(table[True], infer.predict_logits(model, x.flip(-1)))
    seen = []

    def loss_fn(logits, labels, index, flipped):
        assert torch.equal(labels, y[index])
        assert torch.allclose(logits, model(x[index].flip(-1) if flipped else x[index]), atol=1e-6)
        seen.append(flipped)
        return F.cross_entropy(logits, labels)

    infer.fit_classifier(model, x, y, loss_fn, epochs=3, batch_size=8, lr=1e-9)
    assert len(seen) == 24 and 0 < sum(seen) < 24


def test_fit_classifier_is_deterministic_and_learns():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 3, 8, 8, generator=g)
    y = (x[:, 0].mean((1, 2)) > 0).long()  # learnable from the first channel
    models = []
    for _ in range(2):
        torch.manual_seed(0)
        m = small.MLP(in_features=3 * 8 * 8, hidden=(32,), num_classes=2)
        recs = infer.fit_classifier(m, x, y, lambda lo, yy, idx, flipped: F.cross_entropy(lo, yy), epochs=6, batch_size=32,
                                    lr=0.05, seed=3, eval_data=(x, y))
        models.append(m)
    assert all(torch.equal(a, b) for a, b in zip(models[0].state_dict().values(), models[1].state_dict().values()))
    assert recs[-1]["train_loss"] < recs[0]["train_loss"] and recs[-1]["test_accuracy"] > 0.8


# --------------------------------------------------------------------------------------------------
# Size and quantization
# --------------------------------------------------------------------------------------------------

def test_model_size_bytes_counts_the_weights():
    m = nn.Linear(500, 400)
    size = infer.model_size_bytes(m)
    assert 4 * (500 * 400 + 400) <= size < 4 * (500 * 400 + 400) + 4096  # the tensors + a little framing


@pytest.mark.skipif(not {"x86", "fbgemm", "qnnpack"} & set(torch.backends.quantized.supported_engines),
                    reason="this torch build has no int8 CPU engine")
def test_dynamic_quantization_is_four_times_smaller_and_close():
    torch.manual_seed(0)
    m = small.MLP(in_features=256, hidden=(512,), num_classes=10).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation warnings
        q = torch.ao.quantization.quantize_dynamic(m, {nn.Linear}, dtype=torch.qint8)
    ratio = infer.model_size_bytes(m) / infer.model_size_bytes(q)
    assert 3.5 < ratio < 4.1
    x = torch.randn(64, 256)
    with torch.no_grad():
        ref, out = m(x), q(x)
    assert (ref - out).abs().max() < 0.05 * ref.abs().max()
    assert (ref.argmax(1) == out.argmax(1)).float().mean() > 0.9


# --------------------------------------------------------------------------------------------------
# Pruning
# --------------------------------------------------------------------------------------------------

def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(4, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 10))


def test_sparsity_counts_conv_and_linear_weights_only():
    m = _net()
    with torch.no_grad():
        m[0].weight[:2].zero_()  # 2 of 8 output channels: 2 * 4 * 9 = 72 zeros
        m[1].weight.zero_()  # BatchNorm: not counted
        m[4].bias.zero_()  # biases: not counted
    total = 8 * 4 * 9 + 10 * 288
    assert infer.sparsity(m) == pytest.approx(72 / total)
    assert infer.layer_sparsity(m) == {"0": pytest.approx(0.25), "4": 0.0}


@pytest.mark.parametrize("amount", [0.0, 0.3, 0.9])
def test_global_pruning_reaches_the_target(amount):
    m = infer.prune_global(_net(), amount)
    assert infer.sparsity(m) == pytest.approx(amount, abs=1e-3)
    assert not any(name.endswith("_orig") for name, _ in m.named_parameters())  # made permanent


def test_global_pruning_with_masks_kept_stays_sparse_through_training():
    m = infer.prune_global(_net(), 0.8, make_permanent=False)
    assert hasattr(m[0], "weight_mask")
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    m(torch.randn(4, 4, 8, 8)).sum().backward()
    opt.step()
    assert infer.sparsity(m) == pytest.approx(0.8, abs=1e-3)
    infer.remove_masks(m)
    assert not hasattr(m[0], "weight_mask") and infer.sparsity(m) == pytest.approx(0.8, abs=1e-3)


def test_global_pruning_removes_the_smallest_weights():
    m = nn.Sequential(nn.Linear(4, 2), nn.Linear(2, 1))
    with torch.no_grad():
        m[0].weight.copy_(torch.tensor([[1.0, -2.0, 3.0, -4.0], [5.0, 6.0, -7.0, 8.0]]))
        m[1].weight.copy_(torch.tensor([[0.5, -9.0]]))
    infer.prune_global(m, 0.3)  # 3 of 10 weights: 0.5, 1, -2
    assert m[1].weight.tolist() == [[0.0, -9.0]]
    assert m[0].weight[0].tolist() == [0.0, 0.0, 3.0, -4.0]


def test_mask_2_4_keeps_the_two_largest_of_every_four():
    w = torch.tensor([[0.1, -3.0, 2.0, 0.5, 1.0, 1.5, -0.2, -2.5]])
    assert infer.mask_2_4(w).tolist() == [[False, True, True, False, False, True, False, True]]
    w = torch.randn(16, 8, 3, 3)  # a conv weight: rows of 72
    mask = infer.mask_2_4(w)
    assert mask.shape == w.shape and (mask.reshape(16, -1, 4).sum(-1) == 2).all()
    with pytest.raises(ValueError, match="multiple of 4"):
        infer.mask_2_4(torch.randn(4, 27))


def test_prune_2_4_skips_layers_it_cannot_pattern():
    m = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Flatten(), nn.Linear(8, 4))
    skipped = infer.prune_2_4(m)
    assert skipped == ["0"]  # 3 * 3 * 3 = 27 weights per row
    assert infer.layer_sparsity(m) == {"0": 0.0, "2": 0.5}


# --------------------------------------------------------------------------------------------------
# KV cache
# --------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def llm():
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(MICRO_LLAMA.to_hf(bos_token_id=None, eos_token_id=None)).eval()


def test_kv_cache_bytes_formula():
    # Llama 3.2 3B: 28 layers, 8 KV heads of 128, bf16: 114,688 bytes per token
    assert infer.kv_cache_bytes(28, 8, 128, 1) == 114_688
    assert infer.kv_cache_bytes(28, 8, 128, 4096, batch=2) == 2 * 4096 * 114_688
    assert infer.kv_cache_bytes(2, 2, 16, 10, bytes_per_value=4) == 2 * 2 * 2 * 16 * 10 * 4


def test_greedy_generation_same_with_and_without_cache_and_as_generate(llm):
    prompt = torch.randint(0, MICRO_LLAMA.vocab_size, (1, 5), generator=torch.Generator().manual_seed(1))
    cached = infer.greedy_generate(llm, prompt, 12, use_cache=True)
    uncached = infer.greedy_generate(llm, prompt, 12, use_cache=False)
    assert cached.shape == (1, 17) and torch.equal(cached[:, :5], prompt)
    assert torch.equal(cached, uncached)
    with torch.inference_mode():
        ref = llm.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=12)
    assert torch.equal(cached, ref)


def test_measured_cache_matches_the_formula(llm):
    with torch.inference_mode():
        cache = llm(input_ids=torch.zeros(2, 9, dtype=torch.long), use_cache=True).past_key_values
    assert infer.cache_nbytes(cache) == infer.kv_cache_bytes(MICRO_LLAMA.num_layers, MICRO_LLAMA.num_kv_heads, 16,
                                                             9, batch=2, bytes_per_value=4)


def test_decode_step_times_records(llm):
    recs = infer.decode_step_times(llm, [4, 8], use_cache=True, vocab_size=MICRO_LLAMA.vocab_size, repeats=2)
    assert [r["context"] for r in recs] == [4, 8] and all(r["median_s"] > 0 for r in recs)
    assert recs[1]["cache_bytes"] == 2 * recs[0]["cache_bytes"] > 0
    recs = infer.decode_step_times(llm, [4], use_cache=False, vocab_size=MICRO_LLAMA.vocab_size, repeats=1, warmup=0)
    assert recs[0]["cache_bytes"] == 0 and not recs[0]["use_cache"]


def test_copy_of_the_teacher_is_independent():
    """The notebook prunes deep copies: the original model must keep its weights."""
    m = _net()
    before = m[4].weight.clone()
    infer.prune_global(copy.deepcopy(m), 0.9)
    assert torch.equal(m[4].weight, before) and not prune.is_pruned(m)
