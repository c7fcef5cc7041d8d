"""One training loop for the CIFAR-10 lessons, with the switches the course turns on one by one.

The pieces, from small to large:
- :func:`autocast_context` / :func:`make_train_step`: one optimisation step with optional mixed
  precision (bf16 autocast, or fp16 autocast + GradScaler) -- the reference the Jour1 exercises are
  checked against.
- :func:`prepare_model`: channels_last, cudnn.benchmark and torch.compile switches.
- :func:`evaluate`: validation under ``torch.inference_mode`` with the model in eval mode.
- :func:`train`: epochs over a DataLoader, atomic checkpoints, clean stop on SIGTERM / SIGUSR1 (Slurm's
  "time is nearly up" signal), exact resume, and a list of JSON-able records.

Run ``python -m dlo.train --help`` for the command-line form (used by batch jobs and by the tests).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import nn

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


TTA_VIEWS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "identity": lambda x: x,
    "hflip": lambda x: x.flip(-1),  # mirror left-right (the training augmentation's flip)
}


def _tta_views(tta: bool | Sequence[str | Callable] | None) -> list[Callable[[torch.Tensor], torch.Tensor]]:
    """``True`` -> the image and its horizontal flip; a sequence of names of :data:`TTA_VIEWS` or callables
    ``images -> images`` -> those views; ``False``/None -> no TTA (the image alone)."""
    if tta is None or tta is False:
        return [TTA_VIEWS["identity"]]
    if tta is True:
        return [TTA_VIEWS["identity"], TTA_VIEWS["hflip"]]
    if isinstance(tta, (str, bytes)) or not isinstance(tta, Sequence) or len(tta) == 0:
        raise ValueError(f"tta must be True, False or a non-empty list of views ({', '.join(TTA_VIEWS)} or "
                         f"callables), got {tta!r}")
    views = []
    for v in tta:
        if isinstance(v, str):
            if v not in TTA_VIEWS:
                raise ValueError(f"unknown TTA view {v!r}: use one of {', '.join(TTA_VIEWS)} or a callable")
            views.append(TTA_VIEWS[v])
        elif callable(v):
            views.append(v)
        else:
            raise ValueError(f"a TTA view is a name ({', '.join(TTA_VIEWS)}) or a callable, got {v!r}")
    return views


def tta_probabilities(model: nn.Module, images: torch.Tensor, tta: bool | Sequence[str | Callable] = True,
                      device: torch.device | None = None, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Test-time augmentation: the mean over the views of ``softmax(model(view(images)))`` (float32,
    ``[B, num_classes]``). A flipped cat is still a cat: averaging the predictions over views the model was
    trained on smooths out its view-dependent mistakes, at the price of one forward pass per view."""
    device = images.device if device is None else device
    probs = None
    views = _tta_views(tta)
    for view in views:
        with autocast_context(device, dtype):
            logits = model(view(images))
        p = torch.softmax(logits.float(), dim=1)
        probs = p if probs is None else probs + p
    return probs / len(views)


@torch.inference_mode()
def evaluate(model: nn.Module, loader, device: torch.device, dtype: torch.dtype | None = None,
             channels_last: bool = False, max_batches: int | None = None,
             tta: bool | Sequence[str | Callable] = False) -> dict[str, float]:
    """Mean loss and accuracy over ``loader``. Runs in eval mode (BatchNorm uses its running statistics,
    dropout is off) and under ``inference_mode`` (no autograd graph: less memory, faster). Counts are
    accumulated on the device and read once at the end (one synchronisation, not one per batch).

    ``tta=True``: test-time augmentation over the image and its horizontal flip (or the views listed, see
    :func:`tta_probabilities`): the prediction is the mean of the views' softmax probabilities and the loss
    is the negative log of that mean's probability for the true class."""
    was_training = model.training
    model.eval()
    use_tta = tta is not False and tta is not None
    if use_tta:
        _tta_views(tta)  # bad views fail here, in one line, before the first batch
    total_loss = torch.zeros((), device=device, dtype=torch.float64)
    correct = torch.zeros((), device=device, dtype=torch.int64)
    seen = 0
    for i, (images, labels) in enumerate(loader):
        if max_batches is not None and i >= max_batches:
            break
        images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        if channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        if use_tta:
            probs = tta_probabilities(model, images, tta, device, dtype)
            total_loss += nn.functional.nll_loss(probs.clamp_min(1e-12).log(), labels, reduction="sum").double()
            correct += (probs.argmax(dim=1) == labels).sum()
        else:
            with autocast_context(device, dtype):
                logits = model(images)
            total_loss += nn.functional.cross_entropy(logits.float(), labels, reduction="sum").double()
            correct += (logits.argmax(dim=1) == labels).sum()
        seen += labels.numel()
    model.train(was_training)
    if seen == 0:
        raise ValueError("evaluate() got an empty loader")
    return {"loss": total_loss.item() / seen, "accuracy": correct.item() / seen, "samples": seen}


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
    return AveragedModel(_unwrap(model), multi_avg_fn=get_ema_multi_avg_fn(float(decay)), use_buffers=True)


def soft_target_criterion(label_smoothing: float = 0.0) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Cross-entropy that takes integer labels ``[B]`` or soft targets ``[B, K]`` (MixUp/CutMix): the latter
    go through :func:`dlo.augment.soft_cross_entropy`, after label smoothing
    (``t * (1 - eps) + eps / K``) when ``label_smoothing > 0``."""
    from .augment import soft_cross_entropy

    def criterion(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if targets.ndim == 1 and not targets.dtype.is_floating_point:
            return nn.functional.cross_entropy(logits.float(), targets, label_smoothing=label_smoothing)
        if label_smoothing:
            targets = targets * (1 - label_smoothing) + label_smoothing / logits.shape[-1]
        return soft_cross_entropy(logits, targets)

    return criterion


# --------------------------------------------------------------------------------------------------
# Checkpoints
# --------------------------------------------------------------------------------------------------

def rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    try:
        import numpy as np

        state["numpy"] = np.random.get_state()
    except ImportError:  # pragma: no cover
        pass
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "numpy" in state:
        import numpy as np

        np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _unwrap(model: nn.Module) -> nn.Module:
    """The module whose state_dict we save: without torch.compile's or DDP's wrapper prefixes."""
    model = getattr(model, "_orig_mod", model)
    return getattr(model, "module", model)


def save_checkpoint(path: str | os.PathLike, *, model: nn.Module, optimizer=None, scheduler=None, scaler=None,
                    step: int = 0, epoch: int = 0, batch_in_epoch: int = 0, **extra: Any) -> Path:
    """Atomic checkpoint: written to a temporary file then renamed, so a job killed mid-write never
    leaves a truncated checkpoint behind (rename is atomic on POSIX file systems)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {
        "model": _unwrap(model).state_dict(),
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "scaler": scaler.state_dict() if scaler is not None else None,
        "rng": rng_state(),
        "step": step, "epoch": epoch, "batch_in_epoch": batch_in_epoch,
        "extra": extra,
    }
    tmp = path.with_name(path.name + ".tmp")
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def load_checkpoint(path: str | os.PathLike, *, model: nn.Module, optimizer=None, scheduler=None, scaler=None,
                    map_location: str | torch.device = "cpu", restore_rng: bool = True) -> dict[str, Any]:
    """Restore what :func:`save_checkpoint` wrote; returns the checkpoint dict (step, epoch, ...)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}: train without resume first, or give the right --ckpt path")
    state = torch.load(path, map_location=map_location, weights_only=False)
    _unwrap(model).load_state_dict(state["model"])
    if optimizer is not None and state.get("optimizer") is not None:
        optimizer.load_state_dict(state["optimizer"])
    if scheduler is not None and state.get("scheduler") is not None:
        scheduler.load_state_dict(state["scheduler"])
    if scaler is not None and state.get("scaler") is not None:
        scaler.load_state_dict(state["scaler"])
    if restore_rng:
        set_rng_state(state["rng"])
    return state


class StopSignal:
    """Turns SIGTERM / SIGUSR1 into a flag checked between steps.

    Slurm sends SIGTERM at cancellation or preemption, and (with ``#SBATCH --signal=USR1@120``) SIGUSR1
    some time before the time limit. Dying inside ``optimizer.step()`` would lose everything since the
    last checkpoint; instead we note the signal, finish the current step, save, and exit cleanly.
    """

    SIGNALS = ("SIGTERM", "SIGUSR1")

    def __init__(self) -> None:
        self.received: str | None = None
        self._old: dict[int, Any] = {}

    def _handler(self, signum, frame) -> None:  # noqa: ARG002
        self.received = signal.Signals(signum).name

    def __enter__(self) -> "StopSignal":
        import threading

        if threading.current_thread() is threading.main_thread():  # handlers can only be set there
            for name in self.SIGNALS:
                if hasattr(signal, name):
                    sig = getattr(signal, name)
                    self._old[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)

    def __bool__(self) -> bool:
        return self.received is not None


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
                self._state = {k: v.detach().clone() for k, v in _unwrap(model).state_dict().items()}
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
            _unwrap(model).load_state_dict(self._state)
        return model


# --------------------------------------------------------------------------------------------------
# The loop
# --------------------------------------------------------------------------------------------------

@dataclass
class TrainConfig:
    """Every switch of the training loop. ``steps`` bounds the run (None: ``epochs`` full epochs)."""

    epochs: int = 1
    steps: int | None = None
    lr: float = 0.05  # the peak rate of the schedule
    momentum: float = 0.9
    weight_decay: float = 5e-4
    optimizer: str = "sgd_nesterov"  # any name of dlo.optim.make_optimizer
    schedule: str = "onecycle"  # any name of dlo.optim.make_scheduler, stepped once per optimizer step
    warmup_steps: int = 0  # for schedule="warmup_cosine"
    betas: tuple[float, float] | None = None  # Adam-like optimizers; None: the optimizer's default
    accum_steps: int = 1  # micro-batches per optimizer step (gradient accumulation)
    early_stopping: int | None = None  # patience in epochs on the validation accuracy (needs val_loader)
    label_smoothing: float = 0.0
    amp: str | None = None  # 'bf16' | 'fp16' | None
    channels_last: bool = False
    cudnn_benchmark: bool = False
    compile: bool = False
    clip_grad_norm: float | None = None
    seed: int = 0
    log_every: int = 10
    eval_every_epoch: bool = True
    ckpt_path: str | None = None
    ckpt_every: int | None = None  # steps between periodic checkpoints (None: only on signal / at the end)
    resume: bool = False
    progress: bool = True
    # Recipes (fast.ai / DAWNBench lineage); all off by default
    resize_schedule: list[tuple[int, int]] | None = None  # progressive resizing: [(epoch, side), ...] from epoch 0
    batch_schedule: list[tuple[int, int]] | None = None  # dynamic batch size: [(epoch, batch), ...] from epoch 0
    scale_lr_with_batch: bool = False  # with batch_schedule: lr x batch / first batch (linear scaling rule)
    ema_decay: float | None = None  # EMA of the weights (AveragedModel), evaluated instead of the raw model
    tta: bool = False  # evaluate on the image and its horizontal flip (mean of the softmax)
    # Experiment tracking: TensorBoard + MLflow file store under this folder (None: $DLO_TRACKING_DIR if set, else off)
    tracking_dir: str | None = None
    run_name: str | None = None  # the run's name in the tracking stores (default: run-<date-time>)

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {self.epochs}")
        if self.steps is not None and self.steps < 1:
            raise ValueError(f"steps must be >= 1 (or None for whole epochs), got {self.steps}")
        amp_dtype(self.amp)
        if self.resume and not self.ckpt_path:
            raise ValueError("resume=True needs ckpt_path (the checkpoint to resume from)")
        if self.early_stopping is not None and (isinstance(self.early_stopping, bool)
                                                or not isinstance(self.early_stopping, int) or self.early_stopping < 1):
            raise ValueError(f"early_stopping is a patience in epochs (a positive integer) or None, got {self.early_stopping!r}")
        if self.resize_schedule is not None:
            self.resize_schedule = check_schedule(self.resize_schedule, "resize_schedule")
        if self.batch_schedule is not None:
            self.batch_schedule = check_schedule(self.batch_schedule, "batch_schedule")
        elif self.scale_lr_with_batch:
            raise ValueError("scale_lr_with_batch=True scales the lr with batch_schedule: set batch_schedule too")
        if self.ema_decay is not None and (isinstance(self.ema_decay, bool) or not 0.0 < self.ema_decay < 1.0):
            raise ValueError(f"ema_decay must be in (0, 1) (e.g. 0.99) or None, got {self.ema_decay!r}")
        if not isinstance(self.tta, bool):
            raise ValueError(f"tta must be True or False (more views: call evaluate(..., tta=[...])), got {self.tta!r}")
        if self.tracking_dir is not None and str(self.tracking_dir) == "":
            raise ValueError("tracking_dir is empty: give a folder (e.g. runs/<name>/tracking) or None")


@dataclass
class TrainResult:
    records: list[dict[str, Any]] = field(default_factory=list)
    step: int = 0
    stopped_by: str | None = None  # the signal's name when the run was interrupted
    checkpoint: str | None = None
    model: nn.Module | None = None  # the trained model (compiled/channels_last as configured)
    ema_model: nn.Module | None = None  # the AveragedModel when cfg.ema_decay is set (evaluate ema_model.module)
    tracking_run_id: str | None = None  # the MLflow run id when cfg.tracking_dir is set

    @property
    def completed(self) -> bool:
        return self.stopped_by is None


def epoch_generator(seed: int, epoch: int) -> torch.Generator:
    """The DataLoader's generator for an epoch: the shuffling order (and worker seeds) depend only on
    (seed, epoch), so a resumed run sees exactly the batches the interrupted one would have seen."""
    return torch.Generator().manual_seed(seed * 1_000_003 + epoch)


class _IgnoreStopSignals:
    """DataLoader ``worker_init_fn`` wrapper: workers ignore SIGTERM / SIGUSR1. Slurm (scancel, preemption, time
    limit, srun's forwarding) signals every process of the step, workers included; a worker killed by it makes
    the main process raise ("DataLoader worker ... is killed by signal") before it can save its checkpoint.
    The main process stops the workers itself once it has checkpointed."""

    def __init__(self, init: Callable[[int], None] | None) -> None:
        self.init = init

    def __call__(self, worker_id: int) -> None:
        for name in StopSignal.SIGNALS:
            if hasattr(signal, name):
                signal.signal(getattr(signal, name), signal.SIG_IGN)
        if self.init is not None:
            self.init(worker_id)


def _build_loader(make_loader: Callable, seed: int, epoch: int, batch_size: int | None):
    if batch_size is None:
        return make_loader(epoch_generator(seed, epoch))
    return make_loader(epoch_generator(seed, epoch), batch_size=batch_size)


def _check_loader_takes_batch_size(make_loader: Callable) -> None:
    import inspect

    try:
        params = inspect.signature(make_loader).parameters
    except (TypeError, ValueError):  # builtins / C callables: trust the caller
        return
    if "batch_size" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    raise ValueError("batch_schedule rebuilds the loader each epoch with its batch size: define "
                     "make_loader(generator, batch_size=None) (None: your default batch size)")


def _iter_epoch(make_loader: Callable[[torch.Generator], Any], seed: int, epoch: int, skip: int,
                batch_size: int | None = None) -> Iterator:
    loader = _build_loader(make_loader, seed, epoch, batch_size)
    if getattr(loader, "num_workers", 0) > 0 and not isinstance(loader.worker_init_fn, _IgnoreStopSignals):
        loader.worker_init_fn = _IgnoreStopSignals(loader.worker_init_fn)
    it = iter(loader)
    for _ in range(skip):  # replay the batches already trained on, to land on the same next batch
        next(it)
    return it, len(loader)


def train(model: nn.Module, make_loader: Callable[[torch.Generator], Any], cfg: TrainConfig,
          device: torch.device | str = "cpu", val_loader=None,
          on_step: Callable[[int, float], None] | None = None,
          batch_transform: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None = None,
          track_params: dict[str, Any] | None = None) -> TrainResult:
    """Train ``model`` on batches from ``make_loader(generator)`` with ``cfg``'s optimizer and schedule
    (default: SGD with Nesterov momentum and a one-cycle schedule; weight decay only on weights, not on
    biases and BatchNorm parameters, see :func:`dlo.optim.param_groups`).

    ``make_loader`` builds the epoch's DataLoader from a ``torch.Generator`` (see :func:`epoch_generator`).
    With ``cfg.ckpt_path``: a checkpoint is written every ``ckpt_every`` steps, at the end, and when a
    SIGTERM/SIGUSR1 arrives (the run then returns early with ``stopped_by`` set); ``cfg.resume``
    continues from it exactly (same batches, same random numbers).

    Recipes (all off by default):

    - ``cfg.resize_schedule``: each batch is resized on the device to :func:`resolution_at` of the epoch;
    - ``cfg.batch_schedule``: each epoch's loader is built by ``make_loader(generator, batch_size=b)`` with
      ``b =`` :func:`batch_size_at` of the epoch (the LR schedule spans the sum of the epochs' steps);
      ``cfg.scale_lr_with_batch`` multiplies the scheduled lr by ``b / first batch``;
    - ``cfg.ema_decay``: an EMA of the weights (:func:`make_ema`) updated after every optimizer step, and
      evaluated instead of the raw model (``result.ema_model``);
    - ``cfg.tta``: validation with test-time augmentation (:func:`evaluate` ``tta=True``);
    - ``batch_transform(images, labels) -> (images, targets)``: applied to each batch on the device, after
      the resize (e.g. :class:`dlo.augment.MixCutMix`); soft targets ``[B, K]`` are trained with
      :func:`dlo.augment.soft_cross_entropy` (see :func:`soft_target_criterion`).

    ``cfg.tracking_dir`` (or, when it is None, the environment variable ``DLO_TRACKING_DIR``: export it in
    a batch job and every run of every notebook is logged): the run's hyper-parameters (``cfg`` plus
    ``track_params``) and metrics go to TensorBoard and a local MLflow store there (:mod:`dlo.tracking`;
    main process only).
    """
    from tqdm.auto import tqdm

    device = torch.device(device)
    dtype = amp_dtype(cfg.amp)
    if batch_transform is not None and not callable(batch_transform):
        raise ValueError(f"batch_transform must be a callable (images, labels) -> (images, targets), got {batch_transform!r}")
    tracker = None
    tracking_dir = cfg.tracking_dir if cfg.tracking_dir is not None else (os.environ.get("DLO_TRACKING_DIR") or None)
    if tracking_dir is not None and _is_main_process():
        from .tracking import check_writable

        check_writable(tracking_dir)  # fail before any work, not after the run
    torch.manual_seed(cfg.seed)
    model = prepare_model(model, device, channels_last=cfg.channels_last, cudnn_benchmark=cfg.cudnn_benchmark,
                          compile=cfg.compile)
    from .optim import make_optimizer, make_scheduler

    if cfg.early_stopping is not None and (val_loader is None or not cfg.eval_every_epoch):
        raise ValueError("early_stopping watches the validation accuracy: pass val_loader= and keep eval_every_epoch=True")
    if cfg.batch_schedule is not None:
        _check_loader_takes_batch_size(make_loader)
    optimizer = make_optimizer(cfg.optimizer, model, lr=cfg.lr, weight_decay=cfg.weight_decay, momentum=cfg.momentum,
                               **({"betas": tuple(cfg.betas)} if cfg.betas is not None else {}))

    def batch_at(epoch: int) -> int | None:
        return None if cfg.batch_schedule is None else batch_size_at(cfg.batch_schedule, epoch)

    if cfg.batch_schedule is None:
        steps_per_epoch = len(make_loader(epoch_generator(cfg.seed, 0)))
        epoch_steps = [steps_per_epoch] * cfg.epochs
    else:  # the batch changes: so does the number of steps per epoch, and the LR schedule must span their sum
        epoch_steps = [len(_build_loader(make_loader, cfg.seed, e, batch_at(e))) for e in range(cfg.epochs)]
    if cfg.steps is None and 0 in epoch_steps:
        raise ValueError(f"an epoch has no batch (steps per epoch: {epoch_steps}): use a smaller batch size or "
                         "drop_last=False")
    total = cfg.steps if cfg.steps is not None else sum(epoch_steps)
    scheduler = make_scheduler(cfg.schedule, optimizer, total, warmup_steps=cfg.warmup_steps,
                               **({"pct_start": 0.25} if cfg.schedule == "onecycle" else {}))
    scaler = make_grad_scaler(device, dtype)
    if batch_transform is None:
        criterion = nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing)
    else:
        criterion = soft_target_criterion(cfg.label_smoothing)
    step_fn = make_train_step(model, optimizer, criterion, device, dtype, scaler, cfg.clip_grad_norm, cfg.accum_steps)
    early = EarlyStopping(patience=cfg.early_stopping, mode="max") if cfg.early_stopping is not None else None
    ema = make_ema(model, cfg.ema_decay) if cfg.ema_decay is not None else None
    eval_model = ema.module if ema is not None else model
    first_batch = batch_at(0)

    result = TrainResult()
    step, epoch, skip = 0, 0, 0
    if cfg.resume:
        state = load_checkpoint(cfg.ckpt_path, model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler,
                                map_location=device, restore_rng=False)
        saved_total = state["extra"].get("total_steps", total)
        if saved_total != total:
            raise ValueError(f"the checkpoint {cfg.ckpt_path} belongs to a run of {saved_total} steps, this one has "
                             f"{total}: resume with the same --steps/--epochs (the LR schedule depends on it)")
        if ema is not None:
            if state["extra"].get("ema") is None:
                raise ValueError(f"the checkpoint {cfg.ckpt_path} has no EMA weights: resume with the ema_decay "
                                 "of the run that wrote it")
            ema.load_state_dict(state["extra"]["ema"])
        step, epoch, skip = state["step"], state["epoch"], state["batch_in_epoch"]
        result.records.append({"event": "resumed", "step": step, "epoch": epoch})
    else:
        state = None

    if tracking_dir is not None and _is_main_process():
        from .tracking import Tracker

        params = {k: v for k, v in asdict(cfg).items() if k not in ("tracking_dir", "run_name", "progress")}
        params.update(total_steps=total, device=str(device),
                      batch_transform=repr(batch_transform) if batch_transform is not None else None)
        params.update(track_params or {})
        tracker = Tracker(tracking_dir, params, run_name=cfg.run_name)
        result.tracking_run_id = tracker.run_id

    bar = tqdm(total=total, initial=step, desc="train", disable=not cfg.progress, leave=False)
    model.train()
    t_start = time.perf_counter()
    status = "FAILED"
    try:
        with StopSignal() as stop:
            while step < total:
                batch_size = batch_at(epoch)
                it, n_batches = _iter_epoch(make_loader, cfg.seed, epoch, skip, batch_size)
                side = resolution_at(cfg.resize_schedule, epoch) if cfg.resize_schedule is not None else None
                lr_factor = batch_size / first_batch if cfg.scale_lr_with_batch else 1.0
                if state is not None:  # restore the random state only after replaying the skipped batches
                    set_rng_state(state["rng"])
                    state = None
                b = skip
                t_epoch = time.perf_counter()
                for images, labels in it:
                    images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
                    if side is not None:
                        images = resize_batch(images, side)
                    if batch_transform is not None:
                        images, labels = batch_transform(images, labels)
                    if cfg.channels_last:
                        images = images.contiguous(memory_format=torch.channels_last)
                    if lr_factor != 1.0:  # the scheduler keeps its own values: scale for this step only
                        scheduled = [g["lr"] for g in optimizer.param_groups]
                        for g in optimizer.param_groups:
                            g["lr"] = g["lr"] * lr_factor
                    lr = optimizer.param_groups[0]["lr"]  # the rate this step uses
                    loss = step_fn(images, labels)
                    if lr_factor != 1.0:
                        for g, v in zip(optimizer.param_groups, scheduled):
                            g["lr"] = v
                    if ema is not None:
                        ema.update_parameters(_unwrap(model))
                    scheduler.step()
                    step, b = step + 1, b + 1
                    bar.update(1)
                    if step % cfg.log_every == 0 or step == total:
                        loss_value = loss.item()  # one synchronisation every log_every steps, not every step
                        result.records.append({"event": "train", "step": step, "epoch": epoch, "loss": loss_value,
                                               "lr": lr})
                        bar.set_postfix(loss=f"{loss_value:.3f}")
                        if tracker is not None:
                            tracker.log({"train/loss": loss_value, "train/lr": lr}, step)
                        if on_step is not None:
                            on_step(step, loss_value)
                    if cfg.ckpt_path and (stop or step == total or (cfg.ckpt_every and step % cfg.ckpt_every == 0)):
                        done_epoch = b == n_batches
                        save_checkpoint(cfg.ckpt_path, model=model, optimizer=optimizer, scheduler=scheduler,
                                        scaler=scaler, step=step, epoch=epoch + done_epoch,
                                        batch_in_epoch=0 if done_epoch else b, total_steps=total,
                                        **({"ema": ema.state_dict()} if ema is not None else {}))
                        result.checkpoint = cfg.ckpt_path
                    if stop:
                        result.stopped_by = stop.received
                        result.records.append({"event": "stopped", "signal": stop.received, "step": step})
                        break
                    if step >= total:
                        break
                if result.stopped_by:
                    break
                if b == n_batches:
                    from .bench import synchronize

                    synchronize(device)  # the GPU may still be running the last steps: count them in the epoch
                    record = {"event": "epoch", "epoch": epoch, "step": step,
                              "seconds": time.perf_counter() - t_epoch}
                    if batch_size is not None:
                        record["batch_size"] = batch_size
                    if side is not None:
                        record["resolution"] = side
                    if val_loader is not None and cfg.eval_every_epoch:
                        metrics = evaluate(eval_model, val_loader, device, dtype, cfg.channels_last,
                                           **({"tta": True} if cfg.tta else {}))
                        record.update(val_loss=metrics["loss"], val_accuracy=metrics["accuracy"])
                    result.records.append(record)
                    if tracker is not None:
                        tracker.log({f"val/{k[4:]}" if k.startswith("val_") else f"epoch/{k}": v
                                     for k, v in record.items() if k not in ("event", "epoch", "step")}
                                    | {"time/train_s": time.perf_counter() - t_start}, epoch)
                    if early is not None and early.step(metrics["accuracy"], eval_model) and step < total:
                        result.records.append({"event": "early_stop", "epoch": epoch, "step": step,
                                               "best_epoch": early.best_index, "best_val_accuracy": early.best,
                                               "patience": early.patience})
                        break
                    epoch, skip = epoch + 1, 0
                else:
                    skip = b
        status = "KILLED" if result.stopped_by else "FINISHED"
    finally:
        bar.close()
        if tracker is not None:
            tracker.close(status, {"time/train_s": time.perf_counter() - t_start, "train/steps": step})
    if early is not None and early.best_index is not None and not result.stopped_by:
        early.restore_best(eval_model)  # keep the best model seen, not the last one
        result.records.append({"event": "restored_best", "epoch": early.best_index, "val_accuracy": early.best})
    result.step = step
    result.model = model
    result.ema_model = ema
    return result


def _is_main_process() -> bool:
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


# --------------------------------------------------------------------------------------------------
# Command line: python -m dlo.train
# --------------------------------------------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dlo.train", description="Train the CIFAR ResNet-18 with dlo's loop.")
    p.add_argument("--data-dir", default=None, help="folder holding cifar-10-batches-py (default: look, else generate)")
    p.add_argument("--generated", action="store_true", help="force the generated CIFAR-format dataset")
    p.add_argument("--n-train", type=int, default=2000, help="generated data: training images")
    p.add_argument("--width", type=int, default=64, help="ResNet width (64 = standard ResNet-18)")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--amp", choices=["bf16", "fp16", "none"], default="none")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--cudnn-benchmark", action="store_true")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--device", default=None, help="auto (default), cpu or cuda")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ckpt", default=None, help="checkpoint file (saved on SIGTERM/SIGUSR1 and at the end)")
    p.add_argument("--ckpt-every", type=int, default=None)
    p.add_argument("--resume", action="store_true", help="continue from --ckpt")
    p.add_argument("--out", default=None, help="write the records and final metrics to this JSON file")
    p.add_argument("--save-weights", default=None, help="write the final model state_dict to this file")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--no-progress", action="store_true")
    r = p.add_argument_group("recipes (all off by default)")
    r.add_argument("--resize-schedule", type=_schedule_arg, default=None, metavar="E:S,...",
                   help="progressive resizing, e.g. 0:16,2:24,4:32 (from epoch E, images resized to SxS)")
    r.add_argument("--batch-schedule", type=_schedule_arg, default=None, metavar="E:B,...",
                   help="dynamic batch size, e.g. 0:64,3:128 (from epoch E, batches of B); overrides --batch-size")
    r.add_argument("--scale-lr", action="store_true", help="with --batch-schedule: lr x batch / first batch")
    r.add_argument("--ema-decay", type=float, default=None, help="EMA of the weights with this decay (e.g. 0.99)")
    r.add_argument("--label-smoothing", type=float, default=0.0)
    r.add_argument("--mixcutmix", action="store_true", help="MixUp / CutMix on each batch (dlo.augment.MixCutMix)")
    r.add_argument("--eval", action="store_true", help="evaluate on the test split after each epoch")
    r.add_argument("--tta", action="store_true", help="with --eval: test-time augmentation (image + flip)")
    t = p.add_argument_group("experiment tracking")
    t.add_argument("--tracking-dir", default=None, help="log to TensorBoard + MLflow (file store) under this folder")
    t.add_argument("--run-name", default=None, help="the run's name in the tracking stores")
    return p


def _schedule_arg(text: str) -> list[tuple[int, int]]:
    """'0:16,2:24' -> [(0, 16), (2, 24)] (argparse turns the ValueError into a one-line usage error)."""
    try:
        return [(int(e), int(v)) for e, v in (item.split(":") for item in text.split(","))]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: write EPOCH:VALUE pairs separated by commas, e.g. 0:16,2:24") from None


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _main(args)
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _main(args: argparse.Namespace) -> int:
    import dlo  # noqa: F401
    from dlo import data
    from dlo.bench import environment_info, save_json
    from dlo.env import pick_device
    from dlo.models import resnet18_cifar

    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be a positive integer, got {args.batch_size}")
    device = pick_device(args.device)
    if args.tta and not args.eval:
        raise ValueError("--tta changes the evaluation: add --eval")
    cfg = TrainConfig(epochs=args.epochs, steps=args.steps, lr=args.lr, amp=None if args.amp == "none" else args.amp,
                      channels_last=args.channels_last, cudnn_benchmark=args.cudnn_benchmark, compile=args.compile,
                      seed=args.seed, ckpt_path=args.ckpt, ckpt_every=args.ckpt_every, resume=args.resume,
                      log_every=args.log_every, progress=not args.no_progress, eval_every_epoch=args.eval,
                      resize_schedule=args.resize_schedule, batch_schedule=args.batch_schedule,
                      scale_lr_with_batch=args.scale_lr, ema_decay=args.ema_decay, tta=args.tta,
                      label_smoothing=args.label_smoothing, tracking_dir=args.tracking_dir, run_name=args.run_name)
    generated = True if args.generated else None
    train_set = data.cifar10("train", args.data_dir, data.train_transform(), generated=generated,
                             n_train=args.n_train, seed=args.seed)
    val_loader = None
    if args.eval:
        test_set = data.cifar10("test", args.data_dir, data.test_transform(), generated=generated,
                                n_train=args.n_train, seed=args.seed, verbose=False)
        val_loader = data.make_loader(test_set, 512, shuffle=False, num_workers=args.workers,
                                      pin_memory=device.type == "cuda")
    batch_transform = None
    if args.mixcutmix:
        from dlo.augment import MixCutMix

        batch_transform = MixCutMix(num_classes=10, generator=torch.Generator().manual_seed(args.seed))
    torch.manual_seed(args.seed)
    model = resnet18_cifar(width=args.width)

    def make_loader(generator: torch.Generator, batch_size: int | None = None):
        return data.make_loader(train_set, batch_size or args.batch_size, shuffle=True, num_workers=args.workers,
                                drop_last=True, generator=generator, pin_memory=device.type == "cuda")

    def on_step(step: int, loss: float) -> None:
        print(f"step {step} loss {loss:.4f}", flush=True)

    result = train(model, make_loader, cfg, device, val_loader=val_loader, on_step=on_step,
                   batch_transform=batch_transform, track_params={"width": args.width, "dataset": train_set.source})
    for r in result.records:
        if r.get("event") == "epoch" and "val_accuracy" in r:
            print(f"epoch {r['epoch']} val_accuracy {r['val_accuracy']:.4f}", flush=True)
    if result.stopped_by:
        print(f"stopped by {result.stopped_by} at step {result.step}; checkpoint: {result.checkpoint} "
              f"(rerun with --resume to continue)", flush=True)
    if args.save_weights:
        Path(args.save_weights).parent.mkdir(parents=True, exist_ok=True)
        torch.save(_unwrap(result.model).state_dict(), args.save_weights)
    if args.out:
        save_json({"env": environment_info(device), "args": vars(args), "dataset": train_set.source,
                   "step": result.step, "stopped_by": result.stopped_by, "records": result.records}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
