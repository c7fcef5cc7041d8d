"""DeepSpeed ZeRO: the same three sharding levels in another library, configured by a JSON dict."""
from __future__ import annotations

from typing import Any

import torch.distributed as dist
from torch import nn

from dlo.runtime.validate import per_rank_batch
from dlo.runtime.compat import import_deepspeed


def deepspeed_config(stage: int, global_batch: int, world_size: int, *, precision: str = "fp32") -> dict[str, Any]:
    """A DeepSpeed JSON config for ZeRO ``stage`` 1 (optimizer states sharded), 2 (+ gradients), 3 (+ weights)."""

    if stage not in (1, 2, 3):
        raise ValueError(f"ZeRO stage must be 1, 2 or 3, got {stage!r}")
    if precision not in ("fp32", "bf16"):
        raise ValueError(f"DeepSpeed precision must be 'fp32' or 'bf16', got {precision!r}")
    return {
        "train_batch_size": global_batch,
        "train_micro_batch_size_per_gpu": per_rank_batch(global_batch, world_size),
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": stage},
        "bf16": {"enabled": precision == "bf16"},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def deepspeed_initialize(model: nn.Module, optimizer, config: dict[str, Any]):
    """``deepspeed.initialize`` with a torch optimizer (nothing JIT-compiled); returns the engine.

    The process group must exist already (``dlo.runtime.distributed.init_distributed``). On a CPU, DeepSpeed would
    JIT-compile a shared-memory collective (~2 min of C++ on 2 cores): it is switched off, gloo is used."""

    deepspeed = import_deepspeed()
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config,
                                           dist_init_required=not dist.is_initialized())
    return engine
