"""FSDP2 and DeepSpeed ZeRO helpers: the reference implementation of the tp_fsdp workshop.

DDP keeps a full copy of the weights, gradients and optimizer states on every GPU: 16 bytes per parameter
with AdamW, 51 GB for Llama 3.2 3B before a single activation (``dlo.measure.memory``). **FSDP** (fully sharded
data parallelism, ZeRO-3) keeps only ``1/N`` of each on each of ``N`` GPUs and all-gathers one decoder
layer's weights just before that layer runs (forward and again in backward), then frees them; gradients are
reduce-scattered, so each rank ends with the averaged gradient of *its* shard and updates only that shard.

FSDP2 (``torch.distributed.fsdp.fully_shard``) turns each parameter into a ``DTensor`` sharded on dim 0.
Calling ``fully_shard`` on each decoder layer, then on the root model, makes one communication group per
layer (one all-gather / reduce-scatter each) plus one for what is left (embeddings, final norm, head):
layer ``i+1``'s all-gather is prefetched while layer ``i`` computes (:func:`set_prefetch`).

This package holds the pieces the workshop script (``tp_fsdp/fsdp_train.py``) is checked against:

* models: :func:`model_config` (exact Llama 3.2 3B, or small configs), :func:`build_llama`
  (random init, or ``from_pretrained`` from a local folder);
* wrapping: :func:`wrap_ddp`, :func:`apply_fsdp`, :func:`mixed_precision`, :func:`offload_policy`,
  :func:`apply_activation_checkpointing`, :func:`compile_layers`;
* training: :func:`lm_loss`, :func:`batches`, :func:`train_steps` (timed steps, peak memory, losses),
  :func:`throughput` (tokens/s and MFU through :mod:`dlo.measure.flops`, against the peak of the precision
  the step computes in, :func:`compute_precision`);
* prefetching and communication: :func:`set_prefetch` (FSDP2's default schedule, none, or explicit N layers
  ahead), :class:`CollectiveCounter` (collectives per step, count and bytes), :func:`train_step` (one step,
  for the steady timing of the script's ``--timed-repeats``);
* the levers of a fast step: :func:`build_optimizer` (AdamW for-loop, foreach or fused), gradient accumulation
  (:func:`train_step`'s ``grad_accum``), activation checkpointing of every k-th layer, full or op-level
  selective (:func:`apply_activation_checkpointing`), the chunked loss that never holds the ``tokens x vocab``
  logits (:func:`use_chunked_loss`), the SDPA kernel that ran (:func:`sdpa_backends`);
* sharded checkpoints: :func:`save_sharded`, :func:`load_sharded` (``torch.distributed.checkpoint``; a folder is
  loaded without running anything from it, :func:`read_sharded_metadata`);
* DeepSpeed ZeRO: :func:`deepspeed_config`, :func:`deepspeed_initialize`.

Its modules, in the order of the workshop: ``models`` (configurations, losses), ``wrap`` (DDP baseline, FSDP2,
mixed precision, offload, activation checkpointing), ``prefetch`` (all-gather schedules, collectives, one step),
``training`` (timed runs, throughput, the levers of a fast step), ``checkpoint`` (sharded checkpoints, read safely)
and ``zero`` (DeepSpeed).
"""
from __future__ import annotations

from .models import (
    SMOKE_LLAMA, MODEL_CONFIGS, model_config, build_llama, decoder_layers, lm_loss, LOSS_MODES, ChunkedLossHead,
    use_chunked_loss, loss_sum, forward_loss,
)
from .wrap import (
    wrap_ddp, PRECISIONS, mixed_precision, offload_policy, apply_activation_checkpointing, compile_layers,
    apply_fsdp, is_resharded_after_forward, memory_precision, AC_MODES, checkpoint_mode, checkpointed_layers,
    recomputed_layers,
)
from .prefetch import (
    PREFETCH_MODES, set_prefetch, COUNTED_COLLECTIVES, CollectiveCounter, train_step, ACCUM_SYNC,
    _collective_bytes,
)
from .training import (
    batches, train_steps, compute_precision, throughput, full_gradients, OPTIMIZER_IMPLS, build_optimizer,
    optimizer_impl, sdpa_backends,
)
from .checkpoint import (
    save_sharded, load_sharded, read_sharded_metadata, UnsafeCheckpoint, _safe_dcp_reader,
)
from .zero import (
    deepspeed_config, deepspeed_initialize,
)

__all__ = ["SMOKE_LLAMA", "MODEL_CONFIGS", "model_config", "build_llama", "decoder_layers", "lm_loss", "wrap_ddp",
           "PRECISIONS", "mixed_precision", "offload_policy", "apply_activation_checkpointing", "compile_layers",
           "apply_fsdp", "is_resharded_after_forward", "PREFETCH_MODES", "set_prefetch",
           "COUNTED_COLLECTIVES", "CollectiveCounter", "train_step", "batches", "train_steps", "compute_precision", "throughput",
           "save_sharded", "load_sharded", "read_sharded_metadata", "UnsafeCheckpoint", "deepspeed_config", "deepspeed_initialize", "full_gradients", "memory_precision",
           "AC_MODES", "checkpoint_mode", "checkpointed_layers", "recomputed_layers", "LOSS_MODES", "ChunkedLossHead",
           "use_chunked_loss", "loss_sum", "forward_loss", "ACCUM_SYNC", "OPTIMIZER_IMPLS", "build_optimizer",
           "optimizer_impl", "sdpa_backends"]
