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

Its modules: ``calculator`` (parameters, model states, activations, per-GPU memory), ``fsdp_peak`` (an FSDP2
step's peak term by term; fits, min_gpus, max_batch), ``fsdp_plan`` (the largest FSDP2 configuration that fits a
device) and ``tracker`` (:class:`TensorMemoryTracker`).
"""
from __future__ import annotations

from dlo.models.config import TransformerConfig  # the type of every config argument, for notebooks' own configs

from .calculator import (
    GB, GiB, OPTIMIZERS, PRECISIONS, STRATEGIES, ACTIVATION_METHODS, count_parameters, hf_parameter_count,
    parameter_count, training_memory, activation_memory_per_token, activation_memory, per_gpu_memory,
)
from .fsdp_peak import (
    OPTIMIZER_IMPLS, LOSS_MODES, CUDA_CONTEXT_BYTES, FSDP2_FORWARD_BACKWARD_TERMS, selective_activation_per_token,
    optimizer_step_temporaries, fsdp2_peak_memory, fits, min_gpus, max_batch, to_gb,
)
from .tracker import (
    TensorMemoryTracker,
)
from .fsdp_plan import PEAK_MARGIN, largest_fitting

__all__ = [
    "GB", "GiB", "OPTIMIZERS", "PRECISIONS", "STRATEGIES", "ACTIVATION_METHODS", "count_parameters",
    "hf_parameter_count", "parameter_count", "training_memory", "activation_memory_per_token",
    "activation_memory", "per_gpu_memory", "OPTIMIZER_IMPLS", "LOSS_MODES", "CUDA_CONTEXT_BYTES",
    "FSDP2_FORWARD_BACKWARD_TERMS", "selective_activation_per_token", "optimizer_step_temporaries",
    "fsdp2_peak_memory", "fits", "min_gpus", "max_batch", "to_gb", "TensorMemoryTracker", "PEAK_MARGIN",
    "largest_fitting",
]
