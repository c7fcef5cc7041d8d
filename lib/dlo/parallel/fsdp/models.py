"""The models of the FSDP workshop and their losses: the exact Llama 3.2 3B or small configurations
(:func:`model_config`, :func:`build_llama`), the language-model loss, and the chunked loss head that never holds
the ``tokens x vocab`` logits (:func:`use_chunked_loss`)."""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from dlo.models.config import LLAMA_3_2_3B, TINY_LLAMA, TransformerConfig


#: The smoke model: a 2-layer Llama (GQA, SwiGLU, tied embeddings like Llama 3.2) of ~0.1 M parameters,
#: small enough for a few CPU training steps per second on 2 gloo processes.
SMOKE_LLAMA = TransformerConfig(vocab_size=256, hidden_size=64, intermediate_size=172, num_layers=2, num_heads=4,
                                num_kv_heads=2, tie_embeddings=True, name="smoke Llama")
MODEL_CONFIGS = {"llama-3.2-3b": LLAMA_3_2_3B, "tiny": TINY_LLAMA, "smoke": SMOKE_LLAMA}


def model_config(name: str) -> TransformerConfig:
    """A named architecture: ``"llama-3.2-3b"`` (exact, 3,212,749,824 parameters), ``"tiny"``, ``"smoke"``."""
    if name not in MODEL_CONFIGS:
        raise ValueError(f"unknown model {name!r}: choose one of {', '.join(MODEL_CONFIGS)}")
    return MODEL_CONFIGS[name]


def build_llama(cfg: TransformerConfig, *, model_path: str | os.PathLike | None = None, seed: int = 0,
                device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                attn_implementation: str = "sdpa") -> nn.Module:
    """transformers' ``LlamaForCausalLM``: random init from ``cfg`` (seeded: identical on every rank), or the
    weights of a local ``model_path`` (``from_pretrained``, no hub access; ``cfg`` is then ignored)."""
    from transformers import LlamaForCausalLM

    if model_path is not None:
        path = Path(model_path).expanduser()
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"model path {model_path} does not exist or has no config.json: give a folder "
                                    "written by save_pretrained (compute nodes cannot download from the hub), "
                                    "or no path for a random init")
        model = LlamaForCausalLM.from_pretrained(str(path), local_files_only=True, torch_dtype=dtype,
                                                 attn_implementation=attn_implementation)
        return model.to(device)
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(cfg.to_hf(attn_implementation=attn_implementation, use_cache=False))
    return model.to(dtype)


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder layers of a transformers causal LM (``model.model.layers``), under DDP/DeepSpeed too."""
    inner = getattr(model, "module", model)
    try:
        return inner.model.layers
    except AttributeError:
        raise ValueError(f"{type(inner).__name__} has no .model.layers: expected a transformers LlamaForCausalLM") from None


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy (labels already shifted by :mod:`dlo.data.tokens`), in fp32.

    Not divided by the world size: DDP, FSDP and DeepSpeed already *average* the gradients over the ranks."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1))


#: How the loss is computed: ``full`` (transformers' head makes the ``tokens x vocab`` logits, upcast to fp32
#: for the cross-entropy) or ``chunked`` (:class:`ChunkedLossHead`).
LOSS_MODES = ("full", "chunked")


def _chunk_loss_sum(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                    labels: torch.Tensor) -> torch.Tensor:
    logits = F.linear(hidden, weight, bias)  # [chunk, vocab] in the compute dtype
    return F.cross_entropy(logits.float(), labels, reduction="sum")  # fp32 for one chunk only


class ChunkedLossHead(nn.Module):
    """Takes the place of a causal LM's ``lm_head``: given the final hidden states, it returns the **sum** of
    the next-token cross-entropies of the labels set by :meth:`targets`, computed ``chunk_tokens`` tokens at
    a time, each chunk under activation checkpointing. The ``tokens x vocab`` logits (1 GB in bf16 for
    4,096 tokens and Llama 3's 128 k vocabulary, plus 2 GB for each fp32 copy the loss makes) never exist:
    one chunk's logits do, and its backward recomputes them. Same value and gradients as the full loss.

    The head runs inside the model's forward, so FSDP's root unit (which owns the tied embedding/head
    weight) has it gathered, as it would for the plain head. Its parameters are the plain head's
    (``weight``, ``bias``): same names, same tied tensor."""

    def __init__(self, head: nn.Linear, chunk_tokens: int = 1024) -> None:
        super().__init__()
        if not (isinstance(chunk_tokens, int) and chunk_tokens >= 1):
            raise ValueError(f"chunk_tokens must be a positive integer, got {chunk_tokens!r}")
        self.weight = head.weight
        self.bias = head.bias
        self.chunk_tokens = chunk_tokens
        self._labels: torch.Tensor | None = None

    @contextlib.contextmanager
    def targets(self, labels: torch.Tensor):
        """The labels of the next forward (``with head.targets(labels): model(input_ids=ids)``)."""
        self._labels = labels
        try:
            yield self
        finally:
            self._labels = None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        if self._labels is None:
            raise RuntimeError("the chunked loss head needs labels: call the model inside `with head.targets(labels):`")
        hidden = hidden.reshape(-1, hidden.shape[-1])
        labels = self._labels.reshape(-1).to(hidden.device)
        if labels.numel() != hidden.shape[0]:
            raise ValueError(f"{labels.numel()} labels for {hidden.shape[0]} tokens")
        total = hidden.new_zeros((), dtype=torch.float32)
        for start in range(0, hidden.shape[0], self.chunk_tokens):
            stop = start + self.chunk_tokens
            total = total + checkpoint(_chunk_loss_sum, hidden[start:stop], self.weight, self.bias,
                                       labels[start:stop], use_reentrant=False)
        return total


def _inner(model: nn.Module) -> nn.Module:
    return getattr(model, "module", model)  # DDP and DeepSpeed keep the model in .module


def use_chunked_loss(model: nn.Module, chunk_tokens: int = 1024) -> nn.Module:
    """Replace the causal LM's ``lm_head`` by a :class:`ChunkedLossHead` (before ``fully_shard``); return it."""
    inner = _inner(model)
    if isinstance(inner.lm_head, ChunkedLossHead):
        inner.lm_head.chunk_tokens = chunk_tokens
    else:
        inner.lm_head = ChunkedLossHead(inner.lm_head, chunk_tokens)
    return model


def loss_sum(model: nn.Module, ids: torch.Tensor, labels: torch.Tensor, *, engine=None,
             autocast_dtype: torch.dtype | None = None) -> torch.Tensor:
    """The sum over tokens of the next-token cross-entropy of ``labels`` (in fp32), through the plain head
    (full logits) or the :class:`ChunkedLossHead` when :func:`use_chunked_loss` installed one."""
    head = _inner(model).lm_head
    net = engine or model
    chunked = isinstance(head, ChunkedLossHead)
    cast = torch.autocast(ids.device.type, dtype=autocast_dtype) if autocast_dtype else contextlib.nullcontext()
    with cast, (head.targets(labels) if chunked else contextlib.nullcontext()):
        out = net(input_ids=ids).logits
    if chunked:
        return out
    return F.cross_entropy(out.float().reshape(-1, out.shape[-1]), labels.reshape(-1), reduction="sum")


def forward_loss(model: nn.Module, ids: torch.Tensor, labels: torch.Tensor, *, engine=None,
                 autocast_dtype: torch.dtype | None = None, tokens: int | torch.Tensor | None = None) -> torch.Tensor:
    """:func:`loss_sum` divided by ``tokens`` (default: this batch's tokens): the mean loss of the batch, or,
    with the token count of a whole batch, one micro-batch's share of it (gradient accumulation)."""
    total = loss_sum(model, ids, labels, engine=engine, autocast_dtype=autocast_dtype)
    return total / (labels.numel() if tokens is None else tokens)
