"""dlo.models.llama: the from-scratch Llama equals transformers' LlamaForCausalLM, piece by piece and whole."""
from __future__ import annotations

import pytest
import torch

import dlo  # noqa: F401
from dlo.models import llama as L
from dlo.models.config import TransformerConfig
from dlo.measure.memory import count_parameters

SMALL = TransformerConfig(vocab_size=100, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4,
                          num_kv_heads=2, name="test llama")


@pytest.mark.parametrize("tie", [False, True])
def test_logits_equal_transformers_from_the_same_weights(tie):
    cfg = SMALL.replace(tie_embeddings=tie)
    model = L.Llama(cfg, seed=0)
    hf = model.to_hf().eval()
    x, _ = L.token_batch(2, 16, cfg.vocab_size)
    with torch.no_grad():
        torch.testing.assert_close(model(x), hf(x).logits, rtol=1e-5, atol=1e-5)
    assert sum(p.numel() for p in model.parameters()) == count_parameters(cfg)["total"]
    back = L.Llama(cfg, seed=None)
    back.load_hf_state_dict(hf.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(back(x), model(x), rtol=0, atol=0)


def test_rotary_theta_matters_and_matches_transformers():
    model = L.Llama(SMALL, seed=0, rope_theta=500000.0)
    x, _ = L.token_batch(1, 24, SMALL.vocab_size, seed=3)
    with torch.no_grad():
        torch.testing.assert_close(model(x), model.to_hf().eval()(x).logits, rtol=1e-5, atol=1e-5)
        other = L.Llama(SMALL, seed=0)  # same weights, theta 10000
        assert not torch.allclose(model(x), other(x))


def test_loss_and_gradients_equal_transformers():
    model = L.Llama(SMALL, seed=1)
    hf = model.to_hf()
    x, y = L.token_batch(2, 12, SMALL.vocab_size, seed=1)
    model.loss(x, y).backward()
    logits = hf(x).logits
    torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).backward()
    hf_grads = {k.removeprefix("model."): p.grad for k, p in hf.named_parameters()}
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, hf_grads[name], rtol=1e-5, atol=1e-6, msg=name)


def test_same_seed_same_weights_and_causality():
    a, b = L.Llama(SMALL, seed=7), L.Llama(SMALL, seed=7)
    for (n, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), n
    x, _ = L.token_batch(1, 10, SMALL.vocab_size)
    x2 = x.clone()
    x2[0, -1] = (x2[0, -1] + 1) % SMALL.vocab_size  # changing the last token changes no earlier logit
    with torch.no_grad():
        torch.testing.assert_close(a(x)[:, :-1], a(x2)[:, :-1], rtol=0, atol=0)


def test_token_batch_is_shifted_and_deterministic():
    x, y = L.token_batch(3, 8, 50, seed=2, step=5)
    assert x.shape == y.shape == (3, 8)
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert torch.equal(L.token_batch(3, 8, 50, seed=2, step=5)[0], x)
    assert not torch.equal(L.token_batch(3, 8, 50, seed=2, step=6)[0], x)


def test_clear_errors():
    with pytest.raises(ValueError, match="Llama-style models only"):
        L.Llama(SMALL.replace(mlp="gelu"))
    q, k = torch.zeros(1, 6, 4, 8), torch.zeros(1, 4, 4, 8)
    with pytest.raises(ValueError, match="cannot serve 6 query heads"):
        L.causal_attention(q, k, k)
    with pytest.raises(ValueError, match="must be even"):
        L.rotary_cos_sin(4, 7)
