"""fp8 training with torchao, GPU only (part of :mod:`dlo.lessons.apis`): whether this GPU can, which linear layers
are converted, and a bf16 / fp8 comparison run.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import nn

from dlo.models.llama import Llama, lm_loss, token_batch
from dlo.lessons.apis_core import StepMeter, missing_library


#: fp8 matmuls (``torch._scaled_mm``) need compute capability 8.9 or more: Ada (L4, L40S), Hopper (H100, H200),
#: Blackwell. An A100 (8.0) has no fp8 Tensor Cores.
FP8_MIN_CAPABILITY = (8, 9)


def fp8_skip_reason(device: torch.device | str, *, capability: tuple[int, int] | None = None,
                    torchao_missing: str | None = "auto") -> str | None:
    """Why the fp8 section cannot run on ``device``, in one line; None when it can. ``capability`` and
    ``torchao_missing`` default to what this machine reports (tests pass their own)."""
    device = torch.device(device)
    if device.type != "cuda":
        return (f"fp8 training skipped: it needs an NVIDIA GPU of compute capability "
                f"{FP8_MIN_CAPABILITY[0]}.{FP8_MIN_CAPABILITY[1]} or more (fp8 Tensor Cores), this run is on {device.type}")
    if capability is None:
        capability = torch.cuda.get_device_capability(device)
    if tuple(capability) < FP8_MIN_CAPABILITY:
        return (f"fp8 training skipped: this GPU has compute capability {capability[0]}.{capability[1]}, fp8 "
                f"matmuls need {FP8_MIN_CAPABILITY[0]}.{FP8_MIN_CAPABILITY[1]} or more (Ada, Hopper, Blackwell)")
    missing = missing_library("torchao") if torchao_missing == "auto" else torchao_missing
    if missing:
        return f"fp8 training skipped: {missing}"
    return None


def fp8_module_filter(module: nn.Module, fqn: str) -> bool:
    """Which ``nn.Linear`` layers torchao converts to fp8: both dimensions multiples of 16 (what fp8 matmuls
    accept), and not the LM head (its logits feed the softmax: the usual recipe keeps it in bf16)."""
    if not isinstance(module, nn.Linear) or "lm_head" in fqn:
        return False
    return module.in_features % 16 == 0 and module.out_features % 16 == 0


def fp8_summary(bf16: Mapping[str, Any], fp8: Mapping[str, Any]) -> dict[str, Any]:
    """bf16 against fp8 runs (records of :func:`train_fp8_or_bf16`: ``losses`` and ``timing``): throughputs,
    their ratio, the largest loss gap over the steps and the last-step gap (relative to bf16)."""
    if len(bf16["losses"]) != len(fp8["losses"]):
        raise ValueError("the two runs must have run the same number of steps")
    gaps = [abs(a - b) for a, b in zip(fp8["losses"], bf16["losses"])]
    t_bf16, t_fp8 = bf16["timing"]["throughput"], fp8["timing"]["throughput"]
    return {"bf16_tokens_per_s": t_bf16, "fp8_tokens_per_s": t_fp8, "speedup": t_fp8 / t_bf16,
            "max_loss_gap": max(gaps), "last_loss_gap": gaps[-1],
            "last_loss_gap_rel": gaps[-1] / max(abs(bf16["losses"][-1]), 1e-12), "steps": len(gaps),
            "converted_linears": fp8.get("converted_linears")}


def train_fp8_or_bf16(cfg, *, fp8: bool, steps: int, batch: int, seq_len: int, device: torch.device | str = "cuda",
                      seed: int = 0, lr: float = 3e-4, warmup: int = 3, compile: bool = True) -> dict[str, Any]:
    """CUDA only: train the dlo Llama ``cfg`` for ``steps`` steps in bf16 (weights bf16), with the linear
    layers of :func:`fp8_module_filter` converted to torchao's ``Float8Linear`` when ``fp8`` (tensorwise
    scaling; the matmuls run in fp8, the rest in bf16). Same seed, same data in both. Returns ``losses``,
    ``timing`` (a Measurement record, tokens/s) and ``converted_linears``."""
    device = torch.device(device)
    reason = fp8_skip_reason(device) if fp8 else (None if device.type == "cuda" else "bf16 baseline: needs a GPU")
    if reason:
        raise RuntimeError(reason)
    model = Llama(cfg, seed=seed).to(device=device, dtype=torch.bfloat16)
    converted = 0
    if fp8:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        convert_to_float8_training(model, config=Float8LinearConfig(), module_filter_fn=fp8_module_filter)
        converted = sum(type(m).__name__ == "Float8Linear" for m in model.modules())
    if compile:  # fp8 pays off only compiled: the scaling and casting kernels fuse
        model = torch.compile(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    meter = StepMeter(device, tokens_per_step=batch * seq_len, warmup=warmup)
    meter.start()
    for step in range(steps):
        ids, labels = token_batch(batch, seq_len, cfg.vocab_size, seed=seed, step=step)
        loss = lm_loss(model(ids.to(device)), labels.to(device))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        meter.step(loss)
    out = meter.record("fp8" if fp8 else "bf16")
    return {"precision": "fp8" if fp8 else "bf16", "losses": out["losses"], "timing": out["timing"],
            "peak_memory_bytes": out["peak_memory_bytes"], "converted_linears": converted,
            "gpu": torch.cuda.get_device_name(device)}
