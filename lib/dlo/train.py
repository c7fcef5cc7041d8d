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
from typing import Any, Callable, Iterator

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


@torch.inference_mode()
def evaluate(model: nn.Module, loader, device: torch.device, dtype: torch.dtype | None = None,
             channels_last: bool = False, max_batches: int | None = None) -> dict[str, float]:
    """Mean loss and accuracy over ``loader``. Runs in eval mode (BatchNorm uses its running statistics,
    dropout is off) and under ``inference_mode`` (no autograd graph: less memory, faster). Counts are
    accumulated on the device and read once at the end (one synchronisation, not one per batch)."""
    was_training = model.training
    model.eval()
    total_loss = torch.zeros((), device=device, dtype=torch.float64)
    correct = torch.zeros((), device=device, dtype=torch.int64)
    seen = 0
    for i, (images, labels) in enumerate(loader):
        if max_batches is not None and i >= max_batches:
            break
        images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        if channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
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


@dataclass
class TrainResult:
    records: list[dict[str, Any]] = field(default_factory=list)
    step: int = 0
    stopped_by: str | None = None  # the signal's name when the run was interrupted
    checkpoint: str | None = None
    model: nn.Module | None = None  # the trained model (compiled/channels_last as configured)

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


def _iter_epoch(make_loader: Callable[[torch.Generator], Any], seed: int, epoch: int, skip: int) -> Iterator:
    loader = make_loader(epoch_generator(seed, epoch))
    if getattr(loader, "num_workers", 0) > 0 and not isinstance(loader.worker_init_fn, _IgnoreStopSignals):
        loader.worker_init_fn = _IgnoreStopSignals(loader.worker_init_fn)
    it = iter(loader)
    for _ in range(skip):  # replay the batches already trained on, to land on the same next batch
        next(it)
    return it, len(loader)


def train(model: nn.Module, make_loader: Callable[[torch.Generator], Any], cfg: TrainConfig,
          device: torch.device | str = "cpu", val_loader=None,
          on_step: Callable[[int, float], None] | None = None) -> TrainResult:
    """Train ``model`` on batches from ``make_loader(generator)`` with ``cfg``'s optimizer and schedule
    (default: SGD with Nesterov momentum and a one-cycle schedule; weight decay only on weights, not on
    biases and BatchNorm parameters, see :func:`dlo.optim.param_groups`).

    ``make_loader`` builds the epoch's DataLoader from a ``torch.Generator`` (see :func:`epoch_generator`).
    With ``cfg.ckpt_path``: a checkpoint is written every ``ckpt_every`` steps, at the end, and when a
    SIGTERM/SIGUSR1 arrives (the run then returns early with ``stopped_by`` set); ``cfg.resume``
    continues from it exactly (same batches, same random numbers).
    """
    from tqdm.auto import tqdm

    device = torch.device(device)
    dtype = amp_dtype(cfg.amp)
    torch.manual_seed(cfg.seed)
    model = prepare_model(model, device, channels_last=cfg.channels_last, cudnn_benchmark=cfg.cudnn_benchmark,
                          compile=cfg.compile)
    from .optim import make_optimizer, make_scheduler

    if cfg.early_stopping is not None and (val_loader is None or not cfg.eval_every_epoch):
        raise ValueError("early_stopping watches the validation accuracy: pass val_loader= and keep eval_every_epoch=True")
    optimizer = make_optimizer(cfg.optimizer, model, lr=cfg.lr, weight_decay=cfg.weight_decay, momentum=cfg.momentum,
                               **({"betas": tuple(cfg.betas)} if cfg.betas is not None else {}))
    steps_per_epoch = len(make_loader(epoch_generator(cfg.seed, 0)))
    total = cfg.steps if cfg.steps is not None else cfg.epochs * steps_per_epoch
    scheduler = make_scheduler(cfg.schedule, optimizer, total, warmup_steps=cfg.warmup_steps,
                               **({"pct_start": 0.25} if cfg.schedule == "onecycle" else {}))
    scaler = make_grad_scaler(device, dtype)
    criterion = nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing)
    step_fn = make_train_step(model, optimizer, criterion, device, dtype, scaler, cfg.clip_grad_norm, cfg.accum_steps)
    early = EarlyStopping(patience=cfg.early_stopping, mode="max") if cfg.early_stopping is not None else None

    result = TrainResult()
    step, epoch, skip = 0, 0, 0
    if cfg.resume:
        state = load_checkpoint(cfg.ckpt_path, model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler,
                                map_location=device, restore_rng=False)
        saved_total = state["extra"].get("total_steps", total)
        if saved_total != total:
            raise ValueError(f"the checkpoint {cfg.ckpt_path} belongs to a run of {saved_total} steps, this one has "
                             f"{total}: resume with the same --steps/--epochs (the LR schedule depends on it)")
        step, epoch, skip = state["step"], state["epoch"], state["batch_in_epoch"]
        result.records.append({"event": "resumed", "step": step, "epoch": epoch})
    else:
        state = None

    bar = tqdm(total=total, initial=step, desc="train", disable=not cfg.progress, leave=False)
    model.train()
    with StopSignal() as stop:
        while step < total:
            it, n_batches = _iter_epoch(make_loader, cfg.seed, epoch, skip)
            if state is not None:  # restore the random state only after replaying the skipped batches
                set_rng_state(state["rng"])
                state = None
            b = skip
            t_epoch = time.perf_counter()
            for images, labels in it:
                images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
                if cfg.channels_last:
                    images = images.contiguous(memory_format=torch.channels_last)
                lr = optimizer.param_groups[0]["lr"]  # the rate this step uses
                loss = step_fn(images, labels)
                scheduler.step()
                step, b = step + 1, b + 1
                bar.update(1)
                if step % cfg.log_every == 0 or step == total:
                    loss_value = loss.item()  # one synchronisation every log_every steps, not every step
                    result.records.append({"event": "train", "step": step, "epoch": epoch, "loss": loss_value,
                                           "lr": lr})
                    bar.set_postfix(loss=f"{loss_value:.3f}")
                    if on_step is not None:
                        on_step(step, loss_value)
                if cfg.ckpt_path and (stop or step == total or (cfg.ckpt_every and step % cfg.ckpt_every == 0)):
                    done_epoch = b == n_batches
                    save_checkpoint(cfg.ckpt_path, model=model, optimizer=optimizer, scheduler=scheduler,
                                    scaler=scaler, step=step, epoch=epoch + done_epoch,
                                    batch_in_epoch=0 if done_epoch else b, total_steps=total)
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
                record = {"event": "epoch", "epoch": epoch, "step": step, "seconds": time.perf_counter() - t_epoch}
                if val_loader is not None and cfg.eval_every_epoch:
                    metrics = evaluate(model, val_loader, device, dtype, cfg.channels_last)
                    record.update(val_loss=metrics["loss"], val_accuracy=metrics["accuracy"])
                result.records.append(record)
                if early is not None and early.step(metrics["accuracy"], model) and step < total:
                    result.records.append({"event": "early_stop", "epoch": epoch, "step": step,
                                           "best_epoch": early.best_index, "best_val_accuracy": early.best,
                                           "patience": early.patience})
                    break
                epoch, skip = epoch + 1, 0
            else:
                skip = b
    bar.close()
    if early is not None and early.best_index is not None and not result.stopped_by:
        early.restore_best(model)  # keep the best model seen, not the last one
        result.records.append({"event": "restored_best", "epoch": early.best_index, "val_accuracy": early.best})
    result.step = step
    result.model = model
    return result


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
    return p


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
    cfg = TrainConfig(epochs=args.epochs, steps=args.steps, lr=args.lr, amp=None if args.amp == "none" else args.amp,
                      channels_last=args.channels_last, cudnn_benchmark=args.cudnn_benchmark, compile=args.compile,
                      seed=args.seed, ckpt_path=args.ckpt, ckpt_every=args.ckpt_every, resume=args.resume,
                      log_every=args.log_every, progress=not args.no_progress, eval_every_epoch=False)
    train_set = data.cifar10("train", args.data_dir, data.train_transform(),
                             generated=True if args.generated else None, n_train=args.n_train, seed=args.seed)
    torch.manual_seed(args.seed)
    model = resnet18_cifar(width=args.width)

    def make_loader(generator: torch.Generator):
        return data.make_loader(train_set, args.batch_size, shuffle=True, num_workers=args.workers,
                                drop_last=True, generator=generator, pin_memory=device.type == "cuda")

    def on_step(step: int, loss: float) -> None:
        print(f"step {step} loss {loss:.4f}", flush=True)

    result = train(model, make_loader, cfg, device, on_step=on_step)
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
