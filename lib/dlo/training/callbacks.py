"""What the loop can do besides stepping: progressive resizing and dynamic batch size schedules, EMA of
the weights, early stopping.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn
from dlo.training.checkpoint import unwrap_model, load_checkpoint, save_checkpoint


# --------------------------------------------------------------------------------------------------
# Recipes: progressive resizing, dynamic batch size, EMA of the weights, soft-label loss
# --------------------------------------------------------------------------------------------------

def check_schedule(schedule: Any, name: str) -> list[tuple[int, int]]:
    """``[(epoch, value), ...]`` with integer epochs starting at 0 and strictly increasing, positive integer
    values; returned as a list of tuples (JSON gives lists of lists)."""
    example = "[(0, 16), (2, 24), (4, 32)]" if name == "resize_schedule" else "[(0, 64), (3, 128)]"
    try:
        pairs = [(e, v) for e, v in schedule]
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a list of (epoch, value) pairs like {example}, got {schedule!r}") from None
    if not pairs:
        raise ValueError(f"{name} is empty: give (epoch, value) pairs like {example}, or None to turn it off")
    for e, v in pairs:
        for x in (e, v):
            if isinstance(x, bool) or not isinstance(x, int):
                raise ValueError(f"{name}: epochs and values must be integers, got {(e, v)!r} in {schedule!r}")
        if v < 1:
            raise ValueError(f"{name}: values must be positive, got {(e, v)!r}")
    if pairs[0][0] != 0:
        raise ValueError(f"{name} must start at epoch 0 (what does epoch 0 use otherwise?), got {schedule!r}")
    if any(b[0] <= a[0] for a, b in zip(pairs, pairs[1:])):
        raise ValueError(f"{name}: epochs must be strictly increasing, got {schedule!r}")
    return pairs


def _value_at(schedule: Any, epoch: int, name: str) -> int:
    pairs = check_schedule(schedule, name)
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise ValueError(f"epoch must be an integer >= 0, got {epoch!r}")
    value = pairs[0][1]
    for start, v in pairs:
        if start <= epoch:
            value = v
    return value


def resolution_at(schedule: Any, epoch: int) -> int:
    """Progressive resizing: the image side used at ``epoch``: the value of the last ``(start, size)`` pair
    with ``start <= epoch``. ``resolution_at([(0, 16), (2, 24), (4, 32)], 3) == 24``."""
    return _value_at(schedule, epoch, "resize_schedule")


def batch_size_at(schedule: Any, epoch: int) -> int:
    """Dynamic batch size: the batch size used at ``epoch`` (last ``(start, batch)`` with ``start <= epoch``)."""
    return _value_at(schedule, epoch, "batch_schedule")


def resize_batch(images: torch.Tensor, size: int) -> torch.Tensor:
    """Resize a batch ``[B, C, H, W]`` on its device to ``size x size`` (bilinear, antialiased when shrinking);
    unchanged when it already has that size. Done on the batch, after the DataLoader: the loader and its
    augmentation stay the same, only the tensor the model sees shrinks."""
    if images.shape[-2:] == (size, size):
        return images
    shrink = size < images.shape[-1] or size < images.shape[-2]
    fmt = torch.channels_last if images.is_contiguous(memory_format=torch.channels_last) and images.shape[1] > 1 \
        else torch.contiguous_format
    out = nn.functional.interpolate(images, size=(size, size), mode="bilinear", align_corners=False, antialias=shrink)
    return out.contiguous(memory_format=fmt)


def make_ema(model: nn.Module, decay: float) -> torch.optim.swa_utils.AveragedModel:
    """An exponential moving average of ``model``'s weights AND BatchNorm buffers (``use_buffers=True``):
    ``ema = decay * ema + (1 - decay) * weights`` after each optimizer step (the first update copies).
    ``1 / (1 - decay)`` is roughly how many recent steps it averages over: keep it well below the run's steps."""
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0.0 < decay < 1.0:
        raise ValueError(f"ema_decay must be a number in (0, 1), e.g. 0.99 (about the last 100 steps), got {decay!r}")
    return AveragedModel(unwrap_model(model), multi_avg_fn=get_ema_multi_avg_fn(float(decay)), use_buffers=True)


# --------------------------------------------------------------------------------------------------
# Early stopping
# --------------------------------------------------------------------------------------------------

class EarlyStopping:
    """Stop when a validation metric has not improved for ``patience`` evaluations; keep the best weights.

    Training longer than the best epoch only over-fits (or wastes the budget). After each evaluation call
    ``stop = es.step(metric, model)``: when the metric improves by more than ``min_delta`` the model's
    weights are saved (to ``path`` with :func:`save_checkpoint`, atomically, or kept in memory when
    ``path`` is None) and the count restarts; otherwise the count goes up, and ``step`` returns True once
    it reaches ``patience``. Then :meth:`restore_best` puts the best weights back into the model: the
    model you keep is the best one seen, not the last one.

    ``mode="max"`` for accuracies, ``"min"`` for losses.
    """

    def __init__(self, patience: int = 3, min_delta: float = 0.0, mode: str = "max",
                 path: str | os.PathLike | None = None) -> None:
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
            raise ValueError(f"patience must be a positive integer (evaluations without improvement), got {patience!r}")
        if mode not in ("max", "min"):
            raise ValueError(f"mode must be 'max' (accuracy) or 'min' (loss), got {mode!r}")
        if not min_delta >= 0:
            raise ValueError(f"min_delta must be >= 0, got {min_delta!r}")
        self.patience, self.min_delta, self.mode = patience, float(min_delta), mode
        self.path = Path(path) if path is not None else None
        self.best: float | None = None
        self.best_index: int | None = None
        self.bad = 0
        self.history: list[float] = []
        self._state: dict[str, torch.Tensor] | None = None

    def improved(self, metric: float) -> bool:
        if self.best is None:
            return True
        return metric > self.best + self.min_delta if self.mode == "max" else metric < self.best - self.min_delta

    def step(self, metric: float, model: nn.Module, **extra: Any) -> bool:
        """Record ``metric`` for ``model``'s current weights; True when training should stop."""
        metric = float(metric)
        if metric != metric:  # NaN: a diverged run never improves
            self.history.append(metric)
            self.bad += 1
            return self.bad >= self.patience
        if self.improved(metric):
            self.best, self.best_index, self.bad = metric, len(self.history), 0
            if self.path is not None:
                save_checkpoint(self.path, model=model, epoch=len(self.history), metric=metric, **extra)
            else:
                self._state = {k: v.detach().clone() for k, v in unwrap_model(model).state_dict().items()}
        else:
            self.bad += 1
        self.history.append(metric)
        return self.bad >= self.patience

    def restore_best(self, model: nn.Module) -> nn.Module:
        """Load the best weights seen into ``model`` (in place) and return it."""
        if self.best_index is None:
            raise RuntimeError("restore_best() before any step(): there is no best model yet")
        if self.path is not None:
            load_checkpoint(self.path, model=model, restore_rng=False)
        else:
            unwrap_model(model).load_state_dict(self._state)
        return model
