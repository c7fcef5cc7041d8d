"""The largest FSDP2 configuration that fits a device, asked of the calculator (:func:`fsdp2_peak_memory`).

A benchmark sized for an 80 GB H100 leaves most of a 141 GB H200 unused, and one sized for the H200 does not run on
the H100. :func:`largest_fitting` tries the levers a training step has -- the micro-batch (with the accumulation
that keeps the sequences per optimizer step), when gradients are reduced (after every micro-batch, or once at the
end of the accumulation), selective or full activation checkpointing -- and picks the most useful one whose
predicted peak, with a margin, fits the device's memory.

The margin (:data:`PEAK_MARGIN`): the largest underestimate recorded on a GPU (one H100 80GB HBM3: 65.4 GB measured
against 58.3 GB predicted, 12 %; ``results/gpu-check-h100-fsdp_mfu-2026-11-27.json``), plus the CUDA context, which
``max_memory_allocated`` does not count (:data:`CUDA_CONTEXT_BYTES`).
"""
from __future__ import annotations

from typing import Any

from dlo.models.config import TransformerConfig
from dlo.measure.memory.calculator import GB
from dlo.measure.memory.fsdp_peak import CUDA_CONTEXT_BYTES, fsdp2_peak_memory
from dlo.runtime.validate import positive_int

#: Predicted peaks are raised by this fraction before they are compared with the device's memory.
PEAK_MARGIN = 0.12
#: The micro-batches tried (sequences per forward); the accumulation keeps ``sequences_per_step`` per optimizer step.
MICRO_BATCHES = (1, 2, 4, 8)


def _preference(option: dict[str, Any], n_gpus: int) -> tuple:
    """What makes a configuration more useful: selective checkpointing (full recomputes a whole forward, a third more
    work), then a larger micro-batch (fuller kernels, fewer launches), then -- with several GPUs -- reducing the
    gradients once per optimizer step instead of after every micro-batch (on one GPU there is nothing to save)."""
    return (option["checkpointing"] == "selective", option["micro_batch"],
            n_gpus > 1 and option["accum_sync"] == "last")


def largest_fitting(cfg: TransformerConfig, device_bytes: float, n_gpus: int = 1, *, seq_len: int,
                    sequences_per_step: int = 16, margin: float = PEAK_MARGIN, **options: Any) -> dict[str, Any] | None:
    """The most useful configuration (see :func:`_preference`) whose predicted peak per GPU, times ``1 + margin``,
    plus the CUDA context, fits ``device_bytes``; ``sequences_per_step``: sequences per GPU and optimizer step
    (micro-batch x accumulation). ``options``: the rest of :func:`fsdp2_peak_memory`'s arguments (precision, loss,
    optimizer_impl ...). Returns ``micro_batch``, ``grad_accum``, ``accum_sync``, ``checkpointing``,
    ``predicted_bytes`` / ``predicted_gb``, ``limit_gb`` (what the prediction had to stay under) and ``device_gb``;
    None when nothing fits."""
    positive_int("sequences_per_step", sequences_per_step)
    if not device_bytes > 0:
        raise ValueError(f"device_bytes must be positive, got {device_bytes!r}")
    limit = (device_bytes - CUDA_CONTEXT_BYTES) / (1 + margin)
    best = None
    for checkpointing in ("selective", "full"):
        for micro in MICRO_BATCHES:
            if sequences_per_step % micro:
                continue
            accum = sequences_per_step // micro
            for sync in ("every", "last") if accum > 1 else ("last",):
                peak = fsdp2_peak_memory(cfg, n_gpus, batch=micro, seq_len=seq_len, checkpointing=checkpointing,
                                         grad_accum=accum, accum_sync=sync, **options)["total"]
                option = {"micro_batch": micro, "grad_accum": accum, "accum_sync": sync,
                          "checkpointing": checkpointing, "predicted_bytes": peak}
                if peak <= limit and (best is None or _preference(option, n_gpus) > _preference(best, n_gpus)):
                    best = option
    if best is None:
        return None
    return {**best, "predicted_gb": round(best["predicted_bytes"] / GB, 2), "limit_gb": round(limit / GB, 2),
            "device_gb": round(device_bytes / GB, 2), "margin": margin}
