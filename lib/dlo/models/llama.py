"""A Llama-style decoder written out in plain PyTorch: the reference model of the parallelism workshops.

The pipeline and tensor-parallel workshops cut this model into pieces (stages of layers; slices of every
weight matrix), so each piece must be visible: RMSNorm, rotary position embeddings, grouped-query
attention and the SwiGLU MLP are short modules here, with the same parameter names and the same numerics
as ``transformers``' ``LlamaForCausalLM`` (tested: identical logits from the same weights). The shapes
come from :class:`dlo.models.config.TransformerConfig`, the config of the memory and FLOPs calculators.

    from dlo.models.llama import Llama
    from dlo.models.config import TINY_LLAMA
    model = Llama(TINY_LLAMA.replace(num_layers=2), seed=0)
    logits = model(tokens)              # [batch, seq, vocab]
    loss = model.loss(tokens, labels)   # next-token cross-entropy

The building blocks are functions too (:func:`rotary_cos_sin`, :func:`apply_rotary`,
:func:`causal_attention`), so that a parallel attention layer that owns only some of the heads computes
exactly what this one does.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from dlo.models.config import TransformerConfig


def _check_llama_style(cfg: TransformerConfig) -> None:
    if cfg.norm != "rms" or cfg.mlp != "swiglu" or cfg.attention_bias or cfg.mlp_bias:
        raise ValueError(f"dlo.models.llama builds Llama-style models only (norm='rms', mlp='swiglu', no biases); "
                         f"got norm={cfg.norm!r}, mlp={cfg.mlp!r}, attention_bias={cfg.attention_bias}, "
                         f"mlp_bias={cfg.mlp_bias}")


# --------------------------------------------------------------------------------------------------
# Functional pieces (shared with the parallel versions)
# --------------------------------------------------------------------------------------------------

def rotary_cos_sin(seq_len: int, head_dim: int, *, theta: float = 10000.0, device=None,
                   dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables ``[seq_len, head_dim]`` of the rotary embedding (the "rotate half" layout).

    Pair ``i`` of the head dimension (elements ``i`` and ``i + head_dim/2``) turns by the angle
    ``position * theta^(-2i/head_dim)``: low ``i`` turn fast (local order), high ``i`` slowly (far context).
    """
    if head_dim % 2:
        raise ValueError(f"head_dim ({head_dim}) must be even for rotary embeddings")
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim))
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)
    emb = torch.cat((angles, angles), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate queries and keys ``[batch, heads, seq, head_dim]`` by their position (tables from
    :func:`rotary_cos_sin`). Values are not rotated: only the q·k scores need to know relative positions."""
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal scaled dot-product attention with grouped-query K/V.

    ``q`` is ``[batch, heads, seq, head_dim]``; ``k``/``v`` have ``kv_heads`` heads, a divisor of
    ``heads``: each K/V head serves ``heads // kv_heads`` consecutive query heads (it is repeated, not
    recomputed). Returns ``[batch, heads, seq, head_dim]``.
    """
    n_rep = q.shape[1] // k.shape[1]
    if n_rep * k.shape[1] != q.shape[1]:
        raise ValueError(f"{k.shape[1]} K/V heads cannot serve {q.shape[1]} query heads (not a divisor)")
    if n_rep > 1:
        k = k.repeat_interleave(n_rep, dim=1)
        v = v.repeat_interleave(n_rep, dim=1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


# --------------------------------------------------------------------------------------------------
# Modules
# --------------------------------------------------------------------------------------------------

class RMSNorm(nn.Module):
    """``x / rms(x) * weight``, computed in fp32 (as transformers does) and cast back."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class Attention(nn.Module):
    """Grouped-query self-attention with rotary embeddings; ``num_heads`` query heads, ``num_kv_heads``
    key/value heads of size ``head_dim``, no biases (Llama)."""

    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.q_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, k, cos, sin)
        out = causal_attention(q, k, v)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


class SwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))``: the gated MLP of Llama."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderBlock(nn.Module):
    """Pre-norm residual block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``."""

    def __init__(self, cfg: TransformerConfig, eps: float = 1e-6) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, eps)
        self.self_attn = Attention(cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, eps)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    """Embedding -> ``num_layers`` decoder blocks -> final RMSNorm -> LM head (tied to the embedding when
    ``cfg.tie_embeddings``). Weights are initialised like transformers' (normal, std ``init_std``; norms
    at 1) from ``seed``, so two processes building ``Llama(cfg, seed=0)`` hold identical weights."""

    def __init__(self, cfg: TransformerConfig, *, seed: int | None = 0, init_std: float = 0.02,
                 rope_theta: float = 10000.0, rms_norm_eps: float = 1e-6) -> None:
        super().__init__()
        _check_llama_style(cfg)
        self.cfg, self.rope_theta = cfg, rope_theta
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderBlock(cfg, rms_norm_eps) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        if seed is not None:
            self.reset_parameters(seed, init_std)

    @torch.no_grad()
    def reset_parameters(self, seed: int = 0, init_std: float = 0.02) -> None:
        gen = torch.Generator().manual_seed(seed)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                if module is self.lm_head and self.cfg.tie_embeddings:
                    continue
                w = torch.empty(module.weight.shape).normal_(0.0, init_std, generator=gen)
                module.weight.copy_(w)
            elif isinstance(module, RMSNorm):
                module.weight.fill_(1.0)

    def rotary(self, seq_len: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return rotary_cos_sin(seq_len, self.cfg.head_dim, theta=self.rope_theta, device=like.device,
                              dtype=like.dtype)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        cos, sin = self.rotary(input_ids.shape[1], x)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))

    def loss(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy of the logits against ``labels`` (already shifted: ``labels[:, t]`` is the
        token that follows ``input_ids[:, t]``; -100 is ignored)."""
        return lm_loss(self(input_ids), labels)

    # --- transformers interop ---------------------------------------------------------------------
    def load_hf_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        """Load the weights of a transformers ``LlamaForCausalLM`` (same names, ``model.`` prefix dropped)."""
        ours = {}
        for name, tensor in state.items():
            key = name.removeprefix("model.")
            if key.endswith("rotary_emb.inv_freq"):
                continue
            ours[key] = tensor
        if self.cfg.tie_embeddings:
            ours.pop("lm_head.weight", None)
        missing, unexpected = self.load_state_dict(ours, strict=False)
        missing = [m for m in missing if not (self.cfg.tie_embeddings and m == "lm_head.weight")]
        if missing or unexpected:
            raise ValueError(f"state dict does not match this config: missing {missing[:4]}, "
                             f"unexpected {unexpected[:4]}")

    def to_hf(self, **overrides: Any):
        """A transformers ``LlamaForCausalLM`` holding the same weights (for comparisons)."""
        from transformers import LlamaForCausalLM

        hf_cfg = self.cfg.to_hf(rms_norm_eps=self.norm.eps, bos_token_id=None, eos_token_id=None, **overrides)
        hf_cfg.rope_parameters = {"rope_type": "default", "rope_theta": self.rope_theta}
        model = LlamaForCausalLM(hf_cfg)
        state = {("lm_head.weight" if k == "lm_head.weight" else f"model.{k}"): v for k, v in self.state_dict().items()}
        model.load_state_dict(state, strict=False)
        if self.cfg.tie_embeddings:
            model.tie_weights()
        return model


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy, averaged over the tokens whose label is not -100."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)


def token_batch(batch: int, seq_len: int, vocab_size: int, *, seed: int = 0, step: int = 0
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """A deterministic batch of random tokens ``(input_ids, labels)`` with labels shifted by one: the data of
    the parallelism workshops, where the numbers to check are equalities, not what the model learns."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    tokens = torch.randint(0, vocab_size, (batch, seq_len + 1), generator=gen)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


__all__ = ["rotary_cos_sin", "apply_rotary", "causal_attention", "RMSNorm", "Attention", "SwiGLU", "DecoderBlock",
           "Llama", "lm_loss", "token_batch"]
