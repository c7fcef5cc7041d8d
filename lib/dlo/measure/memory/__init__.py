"""How much memory does training a transformer need, and on how many GPUs? A calculator.

Before launching a job on a cluster one wants answers to three questions, all of which are arithmetic:

1. **How many parameters?** Counted layer by layer from the architecture (:func:`count_parameters`),
   checked against transformers' own ``LlamaForCausalLM`` built on the ``meta`` device (no memory used).
2. **How many bytes per parameter?** Weights, gradients and optimizer states depend on the optimizer and
   the precision (:func:`training_memory`): AdamW in mixed precision costs the classic 16 bytes/param,
   so a 3 B model needs ~51 GB *before* a single activation is stored.
3. **What does one GPU hold?** Data parallelism (DDP) replicates everything; ZeRO-1/2/3 (and FSDP, which
   is ZeRO-3) shard optimizer states, then gradients, then weights across the GPUs; activations are
   *not* sharded by any of them (:func:`per_gpu_memory`, :func:`fits`, :func:`min_gpus`, :func:`max_batch`).
   :mod:`dlo.measure.deepspeed_memory` puts DeepSpeed's own ZeRO-2/3 estimators beside these numbers, term by
   term (DeepSpeed, an optional dependency, is imported there inside one function only).

Activations are estimated per token and per layer from what autograd saves in a Llama decoder layer
(:func:`activation_memory_per_token`), a formula the tests check against ``saved_tensors_hooks`` on a real
model. :class:`TensorMemoryTracker` measures the peak memory held by tensors during real training steps,
deterministically, on any device (the CPU has no ``max_memory_allocated``), which is how the tests check
that the estimate is within 20 % of reality.

Units: bytes everywhere; ``GB`` means 1e9 bytes (vendors' "80 GB" H100 actually has 80 GiB ≈ 85.9e9
bytes, so reading it as 80e9 leaves ≈ 5 GB for the CUDA context, communication buffers and allocator
fragmentation, which a real job needs anyway).
"""
from __future__ import annotations

import math
import weakref
from typing import Any, Iterable, Mapping

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from dlo.models.config import TransformerConfig
from dlo.runtime.validate import check_choice, non_negative_int, positive_int

GB = 10**9
GiB = 2**30

OPTIMIZERS = ("adamw", "sgd", "sgd_momentum")
PRECISIONS = ("fp32", "bf16_mixed", "bf16_autocast")
STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "fsdp")
ACTIVATION_METHODS = ("llama", "korthikanti")


# ==================================================================================================
# Parameter count
# ==================================================================================================

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


# ==================================================================================================
# The peak of an FSDP2 training step, term by term
# ==================================================================================================

#: AdamW implementations as ``torch.optim`` runs them (``dlo.parallel.fsdp.optimizer_impl``).
OPTIMIZER_IMPLS = ("for-loop", "foreach", "fused")
#: ``full``: the ``tokens x vocab`` logits and the loss's fp32 buffers; ``chunked``: one chunk of them at a time.
LOSS_MODES = ("full", "chunked")
#: What the CUDA context (kernels, cuBLAS/cuDNN/NCCL handles) takes on a GPU outside PyTorch's allocator: an
#: order of magnitude (0.5-1 GB on an H100 with lazy module loading), not a measured constant. It is not in
#: ``torch.cuda.max_memory_allocated`` (what the runs record), only in what the GPU must have free.
CUDA_CONTEXT_BYTES = 600 * 10**6


#: The terms of :func:`fsdp2_peak_memory` that add up, with the sharded state, to its forward/backward peak.
FSDP2_FORWARD_BACKWARD_TERMS = ("gathered_root", "gathered_layers", "unsharded_layer_grads", "head_grad",
                                "activations", "recompute", "final_norm", "loss_buffers", "chunked_head_grad",
                                "accumulated_unsharded_grads")


def selective_activation_per_token(cfg: TransformerConfig, dtype_bytes: int = 2) -> int:
    """Bytes per token that one decoder layer keeps under op-level selective checkpointing
    (``dlo.parallel.fsdp.apply_activation_checkpointing(mode="selective")``): its input (``hb``) and the
    outputs of its matmuls and of attention: Q, K, V projections (``(q + 2kv)b``), the attention output and
    one fp32 log-sum-exp per head (``qb + 4a``), the output projection (``hb``), gate and up (``2ib``), down
    (``hb``). Norms, rotary embedding, SiLU and products are recomputed in backward."""
    b, h, q, kv, i, a = dtype_bytes, cfg.hidden_size, cfg.q_dim, cfg.kv_dim, cfg.intermediate_size, cfg.num_heads
    return b * (3 * h + 2 * q + 2 * kv + 2 * i) + 4 * a


def optimizer_step_temporaries(largest_tensor: int, local_params: int, impl: str) -> int:
    """Bytes AdamW's step allocates on top of its states, for ``local_params`` fp32 parameters of which the
    largest tensor has ``largest_tensor`` elements: ``foreach`` computes ``sqrt(v)`` for the whole list at
    once (one fp32 copy of every parameter it updates), the ``for-loop`` one tensor at a time (``sqrt(v)``
    and its quotient: two copies of the largest), ``fused`` none (one kernel reads and writes in place)."""
    check_choice("optimizer implementation", impl, OPTIMIZER_IMPLS)
    return {"foreach": 4 * local_params, "for-loop": 2 * 4 * largest_tensor, "fused": 0}[impl]


def fsdp2_peak_memory(cfg: TransformerConfig, n_gpus: int = 1, *, batch: int, seq_len: int,
                      precision: str = "bf16", checkpointing: bool | str = False, ac_every: int = 1,
                      loss: str = "full", loss_chunk_tokens: int = 1024, optimizer_impl: str = "foreach",
                      grad_accum: int = 1, accum_sync: str = "last", accum_keep_gathered: bool = False,
                      reshard_after_forward: bool = True) -> dict[str, int]:
    """The peak bytes one rank allocates in an FSDP2 training step (``torch.cuda.max_memory_allocated``),
    as named terms, for transformers' Llama trained by ``tp_fsdp/fsdp_train.py`` with AdamW; ``batch`` is
    the per-rank *micro*-batch (sequences per forward), ``precision`` ``"bf16"`` (bf16 compute, fp32
    reduction) or ``"fp32"``.

    A step has two peaks; the larger is the step's (``phase`` says which):

    * **forward/backward** (at the start of backward): the sharded state (fp32 parameters, fp32 gradients,
      AdamW's two fp32 moments: 16 bytes per parameter over ``n_gpus``), the root unit's gathered weights
      (embedding/tied head and final norm in the compute dtype: FSDP2 keeps the root gathered from forward
      to the end of backward), two gathered decoder layers (the running one and the prefetched one; all of
      them with ``reshard_after_forward=False`` or ``accum_keep_gathered``), one layer's unsharded gradient
      (compute dtype) and its reduce-dtype copy for the reduce-scatter, the unsharded head gradient, the
      activations (:func:`activation_memory_per_token` for the layers not checkpointed, the layer input for
      ``full`` checkpointing, :func:`selective_activation_per_token` for ``selective``) and what the layer
      being recomputed holds, the final norm's, the loss buffers (``tokens x vocab x 12`` bytes: the fp32
      log-probabilities, their gradient and the gradient of the fp32 logits; ``chunked``: one chunk's, plus a
      second head gradient being summed), and with ``accum_sync="last"`` and ``grad_accum > 1`` the unsharded
      gradients of the whole model in the reduce dtype, held from one micro-batch to the next;
    * **optimizer step**: the sharded state plus AdamW's temporaries (:func:`optimizer_step_temporaries`):
      with ``foreach`` (torch's default on GPUs) one fp32 copy of the parameters, 12.9 GB for Llama 3.2 3B on
      one GPU, so that the optimizer step, not the backward, makes the peak.

    Not in the allocated peak, named apart (``not_allocated_*``): the CUDA context (:data:`CUDA_CONTEXT_BYTES`,
    an order of magnitude) and what the caching allocator reserves beyond what is allocated (fragmentation:
    ``torch.cuda.max_memory_reserved`` minus the allocated peak, measured by the script, not predicted).
    """
    positive_int("batch", batch)
    positive_int("seq_len", seq_len)
    positive_int("n_gpus", n_gpus)
    positive_int("grad_accum", grad_accum)
    check_choice("precision", precision, ("bf16", "fp32"))
    check_choice("loss", loss, LOSS_MODES)
    check_choice("accum_sync", accum_sync, ("last", "every"))
    mode = {False: "none", True: "full", None: "none"}.get(checkpointing, checkpointing)
    check_choice("checkpointing", mode, ("none", "full", "selective"))
    positive_int("ac_every", ac_every)
    b = 2 if precision == "bf16" else 4  # compute dtype (the gathered weights, activations)
    reduce_b = 4                         # gradients are reduced in fp32 in both policies
    c = count_parameters(cfg)
    n, per_layer, L = c["total"], c["per_layer"], cfg.num_layers
    root = c["embeddings"] + c["final_norm"] + c["lm_head"]
    shard = math.ceil(n / n_gpus)
    tokens = batch * seq_len
    out: dict[str, int] = {
        "sharded_params_fp32": 4 * shard,
        "sharded_grads_fp32": 4 * shard,
        "adamw_states_fp32": 8 * shard,
    }
    states = sum(out.values())
    # forward/backward
    keep_all = (not reshard_after_forward) or (accum_keep_gathered and grad_accum > 1)
    out["gathered_root"] = root * b
    out["gathered_layers"] = (L if keep_all else min(2, L)) * per_layer * b
    out["unsharded_layer_grads"] = per_layer * (b + reduce_b)
    out["head_grad"] = (c["embeddings"] if cfg.tie_embeddings else c["lm_head"]) * b
    checkpointed = 0 if mode == "none" else len(range(0, L, ac_every))
    full_layer = activation_memory_per_token(cfg, dtype_bytes=b)
    kept = {"none": full_layer, "full": cfg.hidden_size * b, "selective": selective_activation_per_token(cfg, b)}[mode]
    out["activations"] = tokens * (checkpointed * kept + (L - checkpointed) * full_layer)
    out["recompute"] = tokens * (full_layer - kept) if checkpointed else 0
    out["final_norm"] = tokens * _norm_saved_bytes(cfg, b)
    loss_tokens = tokens if loss == "full" else min(tokens, loss_chunk_tokens)
    out["loss_buffers"] = loss_tokens * cfg.vocab_size * 12
    out["chunked_head_grad"] = out["head_grad"] if loss == "chunked" else 0
    out["accumulated_unsharded_grads"] = n * reduce_b if grad_accum > 1 and accum_sync == "last" else 0
    # optimizer step
    largest = max(c["embeddings"], c["lm_head"], cfg.hidden_size * cfg.intermediate_size)
    out["optimizer_temporaries"] = optimizer_step_temporaries(math.ceil(largest / n_gpus), shard, optimizer_impl)
    out["model_states"] = states
    out["forward_backward"] = states + sum(out[k] for k in FSDP2_FORWARD_BACKWARD_TERMS)
    out["optimizer_step"] = states + out["optimizer_temporaries"]
    out["total"] = max(out["forward_backward"], out["optimizer_step"])
    out["not_allocated_cuda_context"] = CUDA_CONTEXT_BYTES
    return out


def fits(model: TransformerConfig | int, n_gpus: int, gpu_memory_gb: float, **kwargs: Any) -> bool:
    """Whether :func:`per_gpu_memory` (same keyword arguments) fits in ``gpu_memory_gb`` (1e9 bytes)."""
    if not gpu_memory_gb > 0:
        raise ValueError(f"gpu_memory_gb must be positive, got {gpu_memory_gb!r}")
    return per_gpu_memory(model, n_gpus, **kwargs)["total"] <= gpu_memory_gb * GB


def min_gpus(model: TransformerConfig | int, gpu_memory_gb: float, *, strategy: str = "fsdp",
             max_gpus: int = 4096, **kwargs: Any) -> int | None:
    """The fewest GPUs on which each GPU's share fits, or None if even ``max_gpus`` are not enough
    (always the case when what is not sharded, e.g. activations, is too big by itself; DDP shards nothing,
    so it is 1 or None)."""
    positive_int("max_gpus", max_gpus)
    lo, hi = 1, max_gpus
    if not fits(model, hi, gpu_memory_gb, strategy=strategy, **kwargs):
        return None
    while lo < hi:  # memory per GPU decreases with n_gpus: bisect
        mid = (lo + hi) // 2
        if fits(model, mid, gpu_memory_gb, strategy=strategy, **kwargs):
            hi = mid
        else:
            lo = mid + 1
    return lo


def max_batch(model: TransformerConfig, gpu_memory_gb: float, *, seq_len: int, n_gpus: int = 1,
              strategy: str = "ddp", limit: int = 1 << 20, **kwargs: Any) -> int:
    """The largest per-GPU micro-batch (sequences of ``seq_len`` tokens) that fits; 0 when not even one
    sequence does (then: more GPUs with ZeRO-3, activation checkpointing, or shorter sequences)."""
    positive_int("seq_len", seq_len)
    kw = dict(strategy=strategy, seq_len=seq_len, **kwargs)
    if not fits(model, n_gpus, gpu_memory_gb, batch=1, **kw):
        return 0
    lo, hi = 1, 2
    while hi <= limit and fits(model, n_gpus, gpu_memory_gb, batch=hi, **kw):
        lo, hi = hi, hi * 2
    hi = min(hi, limit + 1)
    while hi - lo > 1:  # lo fits, hi does not
        mid = (lo + hi) // 2
        if fits(model, n_gpus, gpu_memory_gb, batch=mid, **kw):
            lo = mid
        else:
            hi = mid
    return lo


def to_gb(breakdown: Mapping[str, int | float]) -> dict[str, float]:
    """A byte breakdown in GB (1e9 bytes), rounded to 0.01, for display; counts are left as they are."""
    skip = ("n_params", "bytes_per_param", "per_token_per_layer")
    return {k: (v if k in skip else round(v / GB, 2)) for k, v in breakdown.items()}


# ==================================================================================================
# Measuring: bytes held by tensors
# ==================================================================================================

class TensorMemoryTracker(TorchDispatchMode):
    """Peak bytes held by tensors while the ``with`` block runs, counted op by op; any device.

    Why not RSS? On the CPU there is no ``max_memory_allocated``, and the resident set size (what
    :class:`dlo.measure.bench.PeakMemory` samples) includes the interpreter and libraries, is sampled every few ms
    (short peaks are missed) and depends on how malloc returns memory to the OS. Here, every ATen operator
    call goes through ``__torch_dispatch__``; each *new* storage among its outputs is added to the live
    total, and removed when the storage is freed (a ``weakref.finalize`` on the storage). The count is
    deterministic: the same steps give the same peak, to the byte.

    Tensors that exist before the block (weights, optimizer states) must be registered: pass modules
    (parameters, buffers, gradients), optimizers (their state tensors) or tensors. Not counted: buffers
    allocated *inside* one kernel (e.g. oneDNN scratch space), allocator caching and fragmentation (the
    CUDA caching allocator reserves more than tensors use), and the Python process itself.
    ``peak_op`` names the operator whose outputs made the peak.
    """

    def __init__(self, *objects: Any) -> None:
        super().__init__()
        self._live: dict[int, int] = {}
        self._finalizers: list[weakref.finalize] = []
        self.current_bytes = 0
        self.peak_bytes = 0
        self.peak_op: str | None = None
        for obj in objects:
            self.register(obj)
        self.baseline_bytes = self.current_bytes

    def register(self, obj: Any) -> None:
        """Count a tensor, the parameters/buffers/gradients of a module, or an optimizer's state."""
        if isinstance(obj, torch.Tensor):
            self._add(obj)
        elif isinstance(obj, torch.nn.Module):
            for t in list(obj.parameters()) + list(obj.buffers()):
                self._add(t)
                if t.grad is not None:
                    self._add(t.grad)
        elif isinstance(obj, torch.optim.Optimizer):
            for state in obj.state.values():
                for v in state.values():
                    if isinstance(v, torch.Tensor):
                        self._add(v)
        elif isinstance(obj, Iterable):
            for x in obj:
                self.register(x)
        else:
            raise TypeError(f"cannot register {type(obj).__name__}: give tensors, modules or optimizers")

    def _add(self, t: torch.Tensor, op: str | None = None) -> None:
        if t.device.type == "meta":
            return
        storage = t.untyped_storage()
        nbytes = storage.nbytes()
        key = id(storage)  # storages keep their Python object while alive, so the id is stable
        if nbytes == 0 or key in self._live:
            return
        self._live[key] = nbytes
        self.current_bytes += nbytes
        self._finalizers.append(weakref.finalize(storage, self._free, key))
        if self.current_bytes > self.peak_bytes:
            self.peak_bytes, self.peak_op = self.current_bytes, op

    def _free(self, key: int) -> None:
        self.current_bytes -= self._live.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._add(t, str(func))
        return out

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        for f in self._finalizers:  # stop counting: the tracker must not outlive its block
            f.detach()
        self._finalizers.clear()
