"""The peak of an FSDP2 training step, term by term (sharded states, gathered layers, activations, recomputation, loss
buffers, the optimizer's temporaries), and the questions it answers: does it fit, on how many GPUs, with which batch."""
from __future__ import annotations

import math
from typing import Any, Mapping

from dlo.models.config import TransformerConfig
from dlo.runtime.validate import check_choice, positive_int
from dlo.measure.memory.calculator import (
    GB, _norm_saved_bytes, activation_memory_per_token, count_parameters, per_gpu_memory,
)


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
