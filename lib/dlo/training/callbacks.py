"""What the loop can do besides stepping: the :class:`Callback` protocol (hooks the loop calls at the start,
after each optimizer step and after each epoch), and the recipes built into the loop: progressive resizing and
dynamic batch size schedules, EMA of the weights, early stopping, stop at a target accuracy.
"""
from __future__ import annotations
from typing import Callable
from dataclasses import dataclass
import time

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


# --------------------------------------------------------------------------------------------------
# Callbacks: what a lesson adds to the one loop without copying it
# --------------------------------------------------------------------------------------------------

class Callback:
    """Hooks of :func:`dlo.training.loop.train`. Override the ones you need; each gets the loop's
    :class:`LoopState` (``step``, ``epoch``, ``total_steps``, the ``model`` and ``optimizer``).

    - ``on_train_start(state)``: once, before the first step (after a resume: at the resumed step);
    - ``on_step_end(state, loss)``: after each optimizer step; ``loss`` is a tensor on the device (reading it
      with ``.item()`` synchronises the device: do it rarely);
    - ``on_epoch_end(state, record)``: after each complete epoch and its evaluation; ``record`` is the epoch's
      JSON record (``seconds``, ``train_loss``, ``val_accuracy`` ...), which the callback may extend. Return
      True to stop the run (the reason is recorded as an ``{"event": "stopped_early"}`` record);
    - ``state_dict()`` / ``load_state_dict(d)``: what the callback must keep across a checkpoint for an exact
      resume (a random generator, a counter); saved with the run's checkpoint.
    """

    def on_train_start(self, state: "LoopState") -> None:
        pass

    def on_step_end(self, state: "LoopState", loss: torch.Tensor) -> None:
        pass

    def on_epoch_end(self, state: "LoopState", record: dict) -> bool | None:
        return None

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


@dataclass
class LoopState:
    """What the loop shows its callbacks."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    total_steps: int
    step: int = 0
    epoch: int = 0


class StopAtTarget(Callback):
    """Stop after the first epoch whose validation accuracy reaches ``target`` (the race's rule), or once
    ``time_budget_s`` seconds have passed on ``clock`` since ``start`` (checked after each epoch). Each epoch's
    record gets ``time_s``: seconds on that clock at the end of the epoch's evaluation."""

    def __init__(self, target: float, *, start: float, time_budget_s: float | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        if not 0.0 < float(target) <= 1.0:
            raise ValueError(f"target must be an accuracy in (0, 1], got {target!r}")
        self.target, self.start, self.time_budget_s, self.clock = float(target), start, time_budget_s, clock
        self.reached: dict | None = None
        self.stopped_by: str | None = None

    def on_epoch_end(self, state: LoopState, record: dict) -> bool:
        if "val_accuracy" not in record:
            raise ValueError("StopAtTarget watches the validation accuracy: pass val_loader= to train()")
        record["time_s"] = self.clock() - self.start
        if record["val_accuracy"] >= self.target:
            self.reached, self.stopped_by = record, "target"
            return True
        if self.time_budget_s is not None and record["time_s"] > self.time_budget_s:
            self.stopped_by = "time_budget"
            return True
        return False


class TrainMetric(Callback):
    """A metric of the training batches, averaged over each epoch and added to the epoch's record as
    ``name``: ``fn(outputs, targets)`` returns a 0-dim tensor (kept on the device: no synchronisation per step).
    The loop's loss is the only place that sees the outputs, so the metric wraps the criterion::

        acc = TrainMetric("train_soft_accuracy", soft_accuracy)
        train(model, make_loader, cfg, criterion=acc.wrap(soft_target_criterion()), callbacks=[acc], ...)
    """

    def __init__(self, name: str, fn: Callable[[torch.Tensor, Any], torch.Tensor]) -> None:
        self.name, self.fn = name, fn
        self._sum: torch.Tensor | None = None
        self._count = 0

    def wrap(self, criterion: Callable[[torch.Tensor, Any], torch.Tensor]) -> Callable[[torch.Tensor, Any], torch.Tensor]:
        def measured(outputs: torch.Tensor, targets: Any) -> torch.Tensor:
            value = self.fn(outputs.detach(), targets).detach().float()
            self._sum = value if self._sum is None else self._sum + value
            self._count += 1
            return criterion(outputs, targets)

        return measured

    def on_epoch_end(self, state: LoopState, record: dict) -> None:
        if self._count:
            record[self.name] = self._sum.item() / self._count
        self._sum, self._count = None, 0


class FreezeNormStats(Callback):
    """Keep in eval mode (running statistics frozen) every normalisation layer whose parameters are all frozen,
    although the loop puts the model in training mode (at the start, and after each evaluation): what a frozen
    backbone needs in transfer learning."""

    @staticmethod
    def apply(model: nn.Module) -> None:
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and not any(p.requires_grad for p in m.parameters()):
                m.eval()

    def on_train_start(self, state: LoopState) -> None:
        self.apply(state.model)

    def on_epoch_end(self, state: LoopState, record: dict) -> None:
        self.apply(state.model)
