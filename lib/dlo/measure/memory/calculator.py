"""The memory calculator: parameters counted layer by layer, the bytes of the model states (weights, gradients,
optimizer states) per optimizer and precision, the activations per token, and what one GPU holds under DDP, ZeRO-1/2/3
or FSDP."""
from __future__ import annotations

import math

import torch

from dlo.models.config import TransformerConfig
from dlo.runtime.validate import check_choice, non_negative_int, positive_int


GB = 10**9
GiB = 2**30

OPTIMIZERS = ("adamw", "sgd", "sgd_momentum")
PRECISIONS = ("fp32", "bf16_mixed", "bf16_autocast")
STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "fsdp")
ACTIVATION_METHODS = ("llama", "korthikanti")


def count_parameters(cfg: TransformerConfig) -> dict[str, int]:
    """Parameters by component. Per-layer entries are for *one* decoder layer; ``attention``, ``mlp``,
    ``layers`` are summed over all layers.

    - embeddings: ``vocab * hidden`` (a lookup table: no FLOPs, but as many bytes as any weight).
    - attention: Q and O are ``hidden x num_heads*head_dim``; K and V only ``hidden x num_kv_heads*head_dim``
      (grouped-query attention is what makes K/V, and the KV cache, small).
    - mlp: SwiGLU has three ``hidden x intermediate`` matrices (gate, up, down); a GELU MLP has two.
    - norms: two per decoder layer (before attention, before the MLP) plus the final one; RMSNorm has a
      weight vector only, LayerNorm a weight and a bias.
    - lm_head: ``hidden x vocab``, **0 when tied** to the embeddings (the same tensor is used twice and
      counted once, as ``model.parameters()`` does).
    - non_embedding: total minus embeddings and lm_head (the convention of scaling laws, see dlo.measure.flops).
    """
    h, q, kv, i = cfg.hidden_size, cfg.q_dim, cfg.kv_dim, cfg.intermediate_size
    ab = 1 if cfg.attention_bias else 0
    mb = 1 if cfg.mlp_bias else 0
    att_q, att_k, att_v = h * q + ab * q, h * kv + ab * kv, h * kv + ab * kv
    att_o = q * h + ab * h  # transformers' Llama puts the bias on o_proj too when attention_bias=True
    n_mats = 3 if cfg.mlp == "swiglu" else 2
    mlp = n_mats * h * i + mb * ((n_mats - 1) * i + h)
    norm = h if cfg.norm == "rms" else 2 * h
    attention = att_q + att_k + att_v + att_o
    per_layer = attention + mlp + 2 * norm
    embeddings = cfg.vocab_size * h
    lm_head = 0 if cfg.tie_embeddings else h * cfg.vocab_size
    layers = cfg.num_layers * per_layer
    total = embeddings + layers + norm + lm_head
    return {
        "embeddings": embeddings,
        "attention_q": att_q, "attention_k": att_k, "attention_v": att_v, "attention_o": att_o,
        "attention_per_layer": attention,
        "mlp_per_layer": mlp,
        "norms_per_layer": 2 * norm,
        "per_layer": per_layer,
        "attention": cfg.num_layers * attention,
        "mlp": cfg.num_layers * mlp,
        "layers": layers,
        "final_norm": norm,
        "lm_head": lm_head,
        "non_embedding": total - embeddings - lm_head,
        "total": total,
    }


def hf_parameter_count(cfg: TransformerConfig) -> int:
    """Parameters of transformers' ``LlamaForCausalLM`` for ``cfg``, built on the meta device (shapes
    only, no memory: a 70 B model is "built" in seconds). ``parameters()`` yields a tied weight once."""
    from transformers import LlamaForCausalLM

    with torch.device("meta"):
        model = LlamaForCausalLM(cfg.to_hf())
    return sum(p.numel() for p in model.parameters())


def parameter_count(model: TransformerConfig | int) -> int:
    if isinstance(model, TransformerConfig):
        return count_parameters(model)["total"]
    return positive_int("n_params", model)


# ==================================================================================================
# Model states: weights, gradients, optimizer states
# ==================================================================================================

#: Bytes per parameter, by precision: (weights, gradients, fp32 master weights, bytes per optimizer
#: state copy, transient low-precision weight copies).
_PRECISION_BYTES = {
    "fp32": (4, 4, 0, 4, 0),
    "bf16_mixed": (2, 2, 4, 4, 0),
    "bf16_autocast": (4, 4, 0, 4, 2),
}
_STATE_COPIES = {"sgd": 0, "sgd_momentum": 1, "adamw": 2}


def training_memory(model: TransformerConfig | int, *, optimizer: str = "adamw",
                    precision: str = "bf16_mixed") -> dict[str, int]:
    """Bytes of the model states (weights, gradients, optimizer states), unsharded, activations apart.

    Optimizer state copies per parameter: SGD 0, SGD with momentum 1 (the velocity), Adam/AdamW 2 (first
    and second moments). Bytes per parameter:

    ==============  =======  =====  =========  ===========  ======  =====  ========  ========
    precision       weights  grads  fp32       autocast     states  AdamW  momentum  SGD
                                    master     bf16 copies  /copy   total  total     total
    ==============  =======  =====  =========  ===========  ======  =====  ========  ========
    fp32            4        4      0          0            4       16     12        8
    bf16_mixed      2        2      4          0            4       16     12        8
    bf16_autocast   4        4      0          2            4       18     14        10
    ==============  =======  =====  =========  ===========  ======  =====  ========  ========

    ``bf16_mixed`` is the convention of the ZeRO paper (Rajbhandari et al. 2020) and Megatron-LM: the
    model holds 16-bit weights and gradients, the optimizer an fp32 "master" copy of the weights (small
    updates would vanish if added to bf16 weights) and fp32 moments: 2 + 2 + 12 = 16 bytes/param, the
    same as plain fp32 (4 + 4 + 8), because mixed precision saves activation memory and time, not
    model-state memory. ``bf16_autocast`` is what ``torch.autocast`` does: parameters and gradients stay
    fp32 and autocast caches a bf16 copy of each weight during forward (kept for backward): 18 bytes.
    """
    check_choice("optimizer", optimizer, OPTIMIZERS)
    check_choice("precision", precision, PRECISIONS)
    n = parameter_count(model)
    w, g, master, state, copies = _PRECISION_BYTES[precision]
    out = {
        "weights": n * w,
        "gradients": n * g,
        "master_weights": n * master,
        "optimizer_states": n * state * _STATE_COPIES[optimizer],
        "weight_copies": n * copies,
    }
    out["total"] = sum(out.values())
    out["bytes_per_param"] = out["total"] // n
    out["n_params"] = n
    return out


# ==================================================================================================
# Activations
# ==================================================================================================

def _norm_saved_bytes(cfg: TransformerConfig, dtype_bytes: int) -> int:
    """Per token, what one transformers RMSNorm saves: its input upcast to fp32 (4h, the same tensor as
    the input in fp32), 1/rms (4), the normalised input and the output in the compute dtype (2h*b)."""
    h = cfg.hidden_size
    return 4 * h + 4 + 2 * h * dtype_bytes


def activation_memory_per_token(cfg: TransformerConfig, *, dtype_bytes: int = 2, checkpointing: bool = False,
                                method: str = "llama", flash_attention: bool = True,
                                seq_len: int | None = None) -> int:
    """Bytes of activations saved for backward, per token and per decoder layer.

    ``method="llama"`` (default) sums the tensors autograd saves in one transformers Llama decoder layer
    (``b = dtype_bytes``, ``h`` hidden, ``q``/``kv`` widths of queries and keys, ``i`` intermediate, ``a``
    heads), checked against ``saved_tensors_hooks`` in the tests:

    - 2 RMSNorms: ``2 * (4h + 4 + 2hb)`` (input in fp32, 1/rms, normalised input, output);
    - attention with SDPA / flash attention: ``b * (2q + 2kv) + 4a`` (rotated Q, rotated K, V, the
      attention output, and one fp32 log-sum-exp per head; the ``s x s`` attention matrix is *not* stored,
      the backward pass recomputes it); the output projection's input is a view of the attention output;
    - SwiGLU MLP: ``4ib`` (gate pre-activation, SiLU output, up projection, their product);
      a GELU MLP saves ``2ib``.
    With ``flash_attention=False`` (transformers' "eager" attention) K and V are repeated to ``q`` width
    and the probabilities are stored: ``+ a*s*(4 + b)`` per token (fp32 softmax and its cast; ``a*s*4``
    in fp32), which grows with the sequence length: this is the ``s^2`` cost that flash attention removes.

    ``method="korthikanti"``: Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
    Transformer Models"), per layer ``s*b*h*(34 + 5*a*s/h)`` bytes, i.e. ``34h + 5as`` per token, for a
    GPT-style layer in 16-bit with a 4h GELU MLP, LayerNorm, dropout and no sequence/tensor parallelism;
    ``flash_attention=True`` drops the ``5as`` term (scores, softmax, dropout mask). It is scaled by
    ``dtype_bytes / 2`` for other dtypes. A cross-check, not an exact count for Llama.

    ``checkpointing=True`` (activation recomputation of whole layers): only each layer's input is kept,
    ``h * b`` per token per layer; the layer's internals are recomputed during backward (see
    :func:`activation_memory`, which adds one layer's worth for that).
    """
    check_choice("activation method", method, ACTIVATION_METHODS)
    positive_int("dtype_bytes", dtype_bytes)
    h, q, kv, i, a = cfg.hidden_size, cfg.q_dim, cfg.kv_dim, cfg.intermediate_size, cfg.num_heads
    if checkpointing:
        return h * dtype_bytes
    if not flash_attention:
        if seq_len is None:
            raise ValueError("without flash attention the activations grow with the sequence: give seq_len")
        positive_int("seq_len", seq_len)
    if method == "korthikanti":
        per_token = 34 * h + (0 if flash_attention else 5 * a * seq_len)
        return per_token * dtype_bytes // 2
    norms = 2 * _norm_saved_bytes(cfg, dtype_bytes)
    if flash_attention:
        attention = dtype_bytes * (2 * q + 2 * kv) + 4 * a
    else:
        probs = a * seq_len * (4 + (dtype_bytes if dtype_bytes != 4 else 0))
        attention = dtype_bytes * 4 * q + probs
    mlp = (4 if cfg.mlp == "swiglu" else 2) * i * dtype_bytes
    return norms + attention + mlp


def activation_memory(cfg: TransformerConfig, batch: int, seq_len: int, *, dtype_bytes: int = 2,
                      checkpointing: bool = False, method: str = "llama", flash_attention: bool = True,
                      include_logits: bool = True) -> dict[str, int]:
    """Activation bytes for a micro-batch of ``batch`` sequences of ``seq_len`` tokens, by component.

    - layers: ``tokens * num_layers * activation_memory_per_token(...)``;
    - recompute: with checkpointing, the one layer being recomputed during backward holds its full
      activations (0 without checkpointing);
    - final_norm: what the final RMSNorm saves;
    - logits: the ``tokens x vocab`` logits kept by the caller (``output.logits``) in the compute dtype,
      plus the fp32 log-probabilities cross-entropy saves (transformers upcasts logits for the loss):
      ``tokens * vocab * (b + 4)``. With a 128 k vocabulary this is larger than a decoder layer! Backward
      briefly adds gradients of the same size; fused/chunked cross-entropy kernels avoid most of it.
    Activations scale with the per-GPU micro-batch and are not sharded by DDP/ZeRO/FSDP.
    """
    positive_int("batch", batch)
    positive_int("seq_len", seq_len)
    tokens = batch * seq_len
    kw = dict(dtype_bytes=dtype_bytes, method=method, flash_attention=flash_attention, seq_len=seq_len)
    per_token = activation_memory_per_token(cfg, checkpointing=checkpointing, **kw)
    full_layer = activation_memory_per_token(cfg, checkpointing=False, **kw)
    out = {
        "per_token_per_layer": per_token,
        "layers": tokens * cfg.num_layers * per_token,
        "recompute": tokens * full_layer if checkpointing else 0,
        "final_norm": tokens * _norm_saved_bytes(cfg, dtype_bytes),
        "logits": tokens * cfg.vocab_size * (dtype_bytes + 4) if include_logits else 0,
    }
    out["total"] = out["layers"] + out["recompute"] + out["final_norm"] + out["logits"]
    return out


# ==================================================================================================
# Per-GPU memory under DDP / ZeRO / FSDP
# ==================================================================================================

_SHARDED = {  # which model states each strategy splits across the GPUs
    "ddp": (),
    "zero1": ("optimizer_states", "master_weights"),
    "zero2": ("optimizer_states", "master_weights", "gradients"),
    "zero3": ("optimizer_states", "master_weights", "gradients", "weights", "weight_copies"),
}
_SHARDED["fsdp"] = _SHARDED["zero3"]
_COMPUTE_BYTES = {"fp32": 4, "bf16_mixed": 2, "bf16_autocast": 2}


def _largest_unit(cfg: TransformerConfig) -> int:
    """Parameters of the largest FSDP unit, assuming one unit per decoder layer and one for each of the
    embedding and the LM head (the usual wrapping policy)."""
    c = count_parameters(cfg)
    return max(c["per_layer"], c["embeddings"], c["lm_head"])


def per_gpu_memory(model: TransformerConfig | int, n_gpus: int = 1, *, strategy: str = "ddp",
                   optimizer: str = "adamw", precision: str = "bf16_mixed", batch: int = 0, seq_len: int = 0,
                   checkpointing: bool = False, flash_attention: bool = True) -> dict[str, int]:
    """Bytes held by *one* of ``n_gpus`` GPUs, by component.

    - ``ddp``: every GPU holds all weights, gradients and optimizer states (constant in ``n_gpus``). Note:
      PyTorch DDP also keeps communication buckets, another copy of the gradients, unless
      ``gradient_as_bucket_view=True``; not counted here.
    - ``zero1``: optimizer states (with the fp32 master weights) are split in ``n_gpus`` shards;
    - ``zero2``: + gradients (reduce-scatter instead of all-reduce);
    - ``zero3`` / ``fsdp`` (FSDP's full-shard strategy *is* ZeRO-3): + weights. Each GPU then gathers one
      unit (decoder layer) at a time: ``gathered`` counts two units of full weights (the current one and
      the prefetched next one) and one unit of full gradients, in the compute dtype; known only when a
      :class:`TransformerConfig` is given (0 for a bare parameter count).
    - ``activations``: from :func:`activation_memory` for the *per-GPU* micro-batch ``batch x seq_len``,
      in the compute dtype (bf16 unless fp32); none of these strategies shards them (tensor, sequence or
      context parallelism do). ``batch=0``: model states only. Needs a TransformerConfig.
    """
    check_choice("strategy", strategy, STRATEGIES)
    positive_int("n_gpus", n_gpus)
    non_negative_int("batch", batch)
    non_negative_int("seq_len", seq_len)
    states = training_memory(model, optimizer=optimizer, precision=precision)
    out: dict[str, int] = {}
    for key in ("weights", "gradients", "master_weights", "optimizer_states", "weight_copies"):
        out[key] = math.ceil(states[key] / n_gpus) if key in _SHARDED[strategy] else states[key]
    out["model_states"] = sum(out.values())
    compute = _COMPUTE_BYTES[precision]
    gathered = 0
    if strategy in ("zero3", "fsdp") and isinstance(model, TransformerConfig):
        gathered = _largest_unit(model) * (2 * compute + compute)
    out["gathered"] = gathered
    if batch and seq_len:
        if not isinstance(model, TransformerConfig):
            raise ValueError("activations need the architecture: pass a TransformerConfig, or batch=0 for "
                             "model states only")
        out["activations"] = activation_memory(model, batch, seq_len, dtype_bytes=compute,
                                               checkpointing=checkpointing,
                                               flash_attention=flash_attention)["total"]
    elif batch or seq_len:
        raise ValueError(f"give both batch and seq_len (got batch={batch}, seq_len={seq_len})")
    else:
        out["activations"] = 0
    out["total"] = out["model_states"] + out["gathered"] + out["activations"]
    return out
