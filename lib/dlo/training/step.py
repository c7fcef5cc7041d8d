"""One optimisation step: mixed precision (bf16 autocast, or fp16 autocast + GradScaler), gradient
accumulation, clipping, and the model switches (channels_last, cudnn.benchmark, torch.compile).
"""
from __future__ import annotations

import contextlib
from typing import Callable

import torch
from torch import nn
from dlo.data.augment import soft_cross_entropy

AMP_DTYPES = {None: None, "none": None, "fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def amp_dtype(name: str | torch.dtype | None) -> torch.dtype | None:
    """'bf16' | 'fp16' | None/'none'/'fp32' -> a torch dtype or None (no autocast)."""
    if name is None or isinstance(name, torch.dtype):
        return name
    if name not in AMP_DTYPES:
        raise ValueError(f"unknown amp dtype {name!r}: use one of 'bf16', 'fp16' or None")
    return AMP_DTYPES[name]


def autocast_context(device: torch.device, dtype: torch.dtype | None):
    """``torch.autocast`` for the device, or a no-op context when ``dtype`` is None."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def make_grad_scaler(device: torch.device, dtype: torch.dtype | None) -> torch.amp.GradScaler | None:
    """fp16 has a narrow exponent range: small gradients underflow to zero. GradScaler multiplies the
    loss before backward and divides the gradients back before the step (skipping steps with inf/nan).
    bf16 has fp32's exponent range and needs no scaler."""
    if dtype is not torch.float16:
        return None
    return torch.amp.GradScaler(device.type)


def make_train_step(model: nn.Module, optimizer: torch.optim.Optimizer, criterion: Callable, device: torch.device,
                    dtype: torch.dtype | None = None, scaler: torch.amp.GradScaler | None = None,
                    clip_grad_norm: float | None = None,
                    accum_steps: int = 1) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """A function ``step(images, labels) -> loss`` (a tensor: calling ``.item()`` would force a
    host-device synchronisation at every step, so the caller decides when to read it).

    ``accum_steps = k > 1``: gradient accumulation. The batch is cut into ``k`` micro-batches; each one
    goes forward and backward alone (activations of one micro-batch in memory at a time) and its loss is
    weighted by its share of the batch (``len(micro) / len(batch)``), so that the gradients summed by
    autograd equal those of the whole batch at once -- for a loss that is a mean over samples. Then one
    optimizer step. BatchNorm is the exception: in training mode it normalises each micro-batch with that
    micro-batch's own mean and variance (and updates its running statistics k times), so the result is
    close to, not equal to, the big batch (see tests/test_train.py).
    """
    if isinstance(accum_steps, bool) or not isinstance(accum_steps, int) or accum_steps < 1:
        raise ValueError(f"accum_steps must be a positive integer (1 = no accumulation), got {accum_steps!r}")

    def forward_backward(images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if accum_steps == 1:
            with autocast_context(device, dtype):
                loss = criterion(model(images), labels)
            (scaler.scale(loss) if scaler is not None else loss).backward()
            return loss.detach()
        if accum_steps > len(images):
            raise ValueError(f"accum_steps={accum_steps} is more than the batch of {len(images)}: "
                             "each micro-batch needs at least one sample")
        total = torch.zeros((), device=images.device)
        for x, y in zip(images.chunk(accum_steps), labels.chunk(accum_steps)):
            with autocast_context(device, dtype):
                loss = criterion(model(x), y) * (len(x) / len(images))
            (scaler.scale(loss) if scaler is not None else loss).backward()
            total += loss.detach().float()
        return total

    def step(images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        loss = forward_backward(images, labels)
        if scaler is not None:
            if clip_grad_norm is not None:
                scaler.unscale_(optimizer)
                nn.utils.clip_grad_norm_(model.parameters(), clip_grad_norm)
            scaler.step(optimizer)
            scaler.update()
        else:
            if clip_grad_norm is not None:
                nn.utils.clip_grad_norm_(model.parameters(), clip_grad_norm)
            optimizer.step()
        return loss

    return step


def check_device_options(device: torch.device, *, cudnn_benchmark: bool = False, dtype: torch.dtype | None = None,
                         compile_mode: str | None = None) -> None:
    """Refuse, in one line, options that only exist on a GPU, instead of silently ignoring them."""
    if device.type != "cuda":
        if cudnn_benchmark:
            raise ValueError("cudnn_benchmark=True needs a CUDA GPU (cuDNN is NVIDIA's library); "
                             "leave it False on CPU")
        if compile_mode in ("reduce-overhead", "max-autotune"):
            raise ValueError(f"torch.compile mode {compile_mode!r} relies on CUDA graphs / GPU autotuning; "
                             "use mode='default' on CPU")


def prepare_model(model: nn.Module, device: torch.device, *, channels_last: bool = False,
                  cudnn_benchmark: bool = False, compile: bool = False, compile_mode: str | None = None) -> nn.Module:
    """Move the model to ``device`` and apply the layout / autotuning / compilation switches."""
    check_device_options(device, cudnn_benchmark=cudnn_benchmark, compile_mode=compile_mode)
    model = model.to(device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = cudnn_benchmark
    if compile:
        model = torch.compile(model, mode=compile_mode)
    return model


def soft_target_criterion(label_smoothing: float = 0.0) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Cross-entropy that takes integer labels ``[B]`` or soft targets ``[B, K]`` (MixUp/CutMix): the latter
    go through :func:`dlo.data.augment.soft_cross_entropy`, after label smoothing
    (``t * (1 - eps) + eps / K``) when ``label_smoothing > 0``."""

    def criterion(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if targets.ndim == 1 and not targets.dtype.is_floating_point:
            return nn.functional.cross_entropy(logits.float(), targets, label_smoothing=label_smoothing)
        if label_smoothing:
            targets = targets * (1 - label_smoothing) + label_smoothing / logits.shape[-1]
        return soft_cross_entropy(logits, targets)

    return criterion
