"""One training loop for the CIFAR-10 lessons, with the switches the course turns on one by one.

The pieces, from small to large:
- :func:`autocast_context` / :func:`make_train_step`: one optimisation step with optional mixed
  precision (bf16 autocast, or fp16 autocast + GradScaler) -- the reference the Jour1 exercises are
  checked against.
- :func:`prepare_model`: channels_last, cudnn.benchmark and torch.compile switches.
- :func:`evaluate`: validation under ``torch.inference_mode`` with the model in eval mode.
- :func:`train`: epochs over a DataLoader, atomic checkpoints, clean stop on SIGTERM / SIGUSR1 (Slurm's
  "time is nearly up" signal), exact resume, and a list of JSON-able records.

Run ``python -m dlo train --help`` for the command-line form (used by batch jobs and by the tests).
"""
from __future__ import annotations

import os
import signal
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import nn
from dlo.training.callbacks import (Callback, EarlyStopping, LoopState, batch_size_at, make_ema, resize_batch,
                                    resolution_at)
from dlo.training.checkpoint import StopSignal, unwrap_model, load_checkpoint, save_checkpoint, set_rng_state
from dlo.training.config import TrainConfig
from dlo.runtime import progress
from dlo.runtime.context import is_main_process
from dlo.training.step import amp_dtype, make_grad_scaler, make_train_step, prepare_model, soft_target_criterion
from dlo.training.evaluate import evaluate
from dlo.training.tracking import check_writable
from dlo.training.optim import make_optimizer, make_scheduler
from dlo.training.tracking import Tracker
from dlo.runtime.device import synchronize


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


def _to_device(targets: Any, device: torch.device) -> Any:
    """The batch's targets on the device: a tensor, or a tuple / list / dict of them (a lesson's loss may need
    more than the labels, e.g. the images' positions to look up a teacher's logits)."""
    if isinstance(targets, torch.Tensor):
        return targets.to(device, non_blocking=True)
    if isinstance(targets, (tuple, list)):
        return type(targets)(_to_device(t, device) for t in targets)
    if isinstance(targets, dict):
        return {k: _to_device(v, device) for k, v in targets.items()}
    return targets


def _schedule_options(cfg: TrainConfig, total: int) -> dict[str, Any]:
    """The schedule's warm-up from the config: ``warmup_frac`` of the steps when set, else ``warmup_steps``
    (onecycle: its rising phase, ``pct_start``, 0.25 by default)."""
    if cfg.schedule == "onecycle":
        frac = 0.25 if cfg.warmup_frac is None else cfg.warmup_frac
        if total < 3 and cfg.warmup_frac is None:
            return {"pct_start": frac}
        if total < 3:
            raise ValueError(f"the onecycle schedule needs at least 3 optimizer steps, this run makes {total}: "
                             "more epochs, a smaller batch, or another schedule")
        # at least 2 rising steps and 1 falling one (torch divides by pct_start * total - 1: 0.25 x 4 steps crashed)
        return {"pct_start": min(max(frac, 2 / total), 1 - 1 / total)}
    warmup = cfg.warmup_steps if cfg.warmup_frac is None else int(cfg.warmup_frac * total)
    return {"warmup_steps": min(warmup, max(total - 1, 0))}


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


def _epoch_line(record: dict[str, Any], epochs: int, total: int) -> str:
    """The log line of a finished epoch: ``train: epoch 2/3 at step 32/48, train loss 1.934, val accuracy 41.0 %
    (3.2 s)``."""
    parts = [f"train: epoch {record['epoch'] + 1}/{epochs} at step {record['step']}/{total}"]
    if "train_loss" in record:
        parts.append(f"train loss {record['train_loss']:.3f}")
    if "val_accuracy" in record:
        parts.append(f"val accuracy {100 * record['val_accuracy']:.1f} %")
    return ", ".join(parts) + f" ({record['seconds']:.1f} s)"


def train(model: nn.Module, make_loader: Callable[[torch.Generator], Any], cfg: TrainConfig,
          device: torch.device | str = "cpu", val_loader=None,
          on_step: Callable[[int, float], None] | None = None,
          batch_transform: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None = None,
          track_params: dict[str, Any] | None = None, callbacks: Sequence[Callback] = (),
          criterion: Callable[[torch.Tensor, Any], torch.Tensor] | None = None,
          optimizer: torch.optim.Optimizer | None = None) -> TrainResult:
    """Train ``model`` on batches from ``make_loader(generator)`` with ``cfg``'s optimizer and schedule
    (default: SGD with Nesterov momentum and a one-cycle schedule; weight decay only on weights, not on
    biases and BatchNorm parameters, see :func:`dlo.training.optim.param_groups`).

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
      the resize (e.g. :class:`dlo.data.augment.MixCutMix`); soft targets ``[B, K]`` are trained with
      :func:`dlo.data.augment.soft_cross_entropy` (see :func:`soft_target_criterion`).

    What a lesson adds goes in ``callbacks`` (:class:`dlo.training.callbacks.Callback`: hooks at the start, after
    each step, after each epoch, which can stop the run; their ``state_dict`` is checkpointed). ``criterion``
    replaces the loss (default: cross-entropy with ``cfg.label_smoothing``, soft-target cross-entropy with a
    ``batch_transform``); it gets the model's output and the batch's targets, which may be a tensor or a
    tuple/dict of tensors (all moved to the device). ``optimizer``: a ready optimizer instead of
    ``cfg.optimizer`` (its learning rate is then the optimizer's own; ``cfg.schedule=None`` keeps it constant).
    A ``batch_transform`` with ``state_dict`` / ``load_state_dict`` (e.g. MixCutMix's generator) is
    checkpointed too, so that a resumed run draws the same mixes.

    ``cfg.tracking_dir`` (or, when it is None, the environment variable ``DLO_TRACKING_DIR``: export it in
    a batch job and every run of every notebook is logged): the run's hyper-parameters (``cfg`` plus
    ``track_params``) and metrics go to TensorBoard and a local MLflow store there (:mod:`dlo.training.tracking`;
    main process only).
    """
    run = _Run(model, make_loader, cfg, torch.device(device), val_loader=val_loader, on_step=on_step,
               batch_transform=batch_transform, callbacks=callbacks, criterion=criterion, optimizer=optimizer)
    run.resume()
    run.start_tracking(track_params)
    run.start()
    run.epochs()
    return run.finish()


# --------------------------------------------------------------------------------------------------
# The phases of train(): set-up, resume, tracking, the epoch loop (step, checkpoint, end of epoch), finish
# --------------------------------------------------------------------------------------------------

class _Run:
    """One call of :func:`train`: what its phases share, and the phases as methods, in the order they run."""

    def __init__(self, model: nn.Module, make_loader: Callable, cfg: TrainConfig, device: torch.device, *,
                 val_loader, on_step, batch_transform, callbacks: Sequence[Callback], criterion, optimizer) -> None:
        """Set-up: every check that can fail runs before any work; then the model, optimizer, schedule, step."""
        dtype = amp_dtype(cfg.amp)
        if batch_transform is not None and not callable(batch_transform):
            raise ValueError("batch_transform must be a callable (images, labels) -> (images, targets), "
                             f"got {batch_transform!r}")
        self.tracking_dir = (cfg.tracking_dir if cfg.tracking_dir is not None
                             else (os.environ.get("DLO_TRACKING_DIR") or None))
        if self.tracking_dir is not None and is_main_process():
            check_writable(self.tracking_dir)  # fail before any work, not after the run
        torch.manual_seed(cfg.seed)
        model = prepare_model(model, device, channels_last=cfg.channels_last, cudnn_benchmark=cfg.cudnn_benchmark,
                              compile=cfg.compile)
        if cfg.early_stopping is not None and (val_loader is None or not cfg.eval_every_epoch):
            raise ValueError("early_stopping watches the validation accuracy: pass val_loader= and keep "
                             "eval_every_epoch=True")
        if cfg.batch_schedule is not None:
            _check_loader_takes_batch_size(make_loader)
        if optimizer is None:
            betas = {"betas": tuple(cfg.betas)} if cfg.betas is not None else {}
            optimizer = make_optimizer(cfg.optimizer, model, lr=cfg.lr, weight_decay=cfg.weight_decay,
                                       momentum=cfg.momentum, **betas)
        self.cfg, self.device, self.dtype, self.model, self.optimizer = cfg, device, dtype, model, optimizer
        self.make_loader, self.val_loader, self.on_step = make_loader, val_loader, on_step
        self.batch_transform, self.callbacks = batch_transform, list(callbacks)
        self.total = self._total_steps()
        self.scheduler = None if cfg.schedule is None else make_scheduler(cfg.schedule, optimizer, self.total,
                                                                          **_schedule_options(cfg, self.total))
        self.scaler = make_grad_scaler(device, dtype)
        if criterion is None:
            criterion = (nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing) if batch_transform is None
                         else soft_target_criterion(cfg.label_smoothing))
        # what a checkpoint keeps besides the model, optimizer, schedule and scaler: for an exact resume
        self.stateful = {f"callback{i}": cb for i, cb in enumerate(self.callbacks)}
        if batch_transform is not None and hasattr(batch_transform, "state_dict"):
            self.stateful["batch_transform"] = batch_transform
        self.step_fn = make_train_step(model, optimizer, criterion, device, dtype, self.scaler, cfg.clip_grad_norm,
                                       cfg.accum_steps)
        self.early = EarlyStopping(patience=cfg.early_stopping, mode="max") if cfg.early_stopping is not None else None
        self.ema = make_ema(model, cfg.ema_decay) if cfg.ema_decay is not None else None
        self.eval_model = self.ema.module if self.ema is not None else model
        self.first_batch = self.batch_at(0)
        self.result = TrainResult()
        self.step, self.epoch, self.skip = 0, 0, 0
        self.saved = None  # the checkpoint resumed from, until its random state is restored
        self.tracker = None

    def batch_at(self, epoch: int) -> int | None:
        return None if self.cfg.batch_schedule is None else batch_size_at(self.cfg.batch_schedule, epoch)

    def _total_steps(self) -> int:
        """The run's optimizer steps: ``cfg.steps``, else the sum of the epochs' (the LR schedule spans them)."""
        cfg = self.cfg
        if cfg.batch_schedule is None:
            steps_per_epoch = len(self.make_loader(epoch_generator(cfg.seed, 0)))
            epoch_steps = [steps_per_epoch] * cfg.epochs
        else:  # the batch changes: so does the number of steps per epoch, and the LR schedule must span their sum
            epoch_steps = [len(_build_loader(self.make_loader, cfg.seed, e, self.batch_at(e)))
                           for e in range(cfg.epochs)]
        if cfg.steps is None and 0 in epoch_steps:
            raise ValueError(f"an epoch has no batch (steps per epoch: {epoch_steps}): use a smaller batch size or "
                             "drop_last=False")
        return cfg.steps if cfg.steps is not None else sum(epoch_steps)

    def resume(self) -> None:
        """With ``cfg.resume``: the checkpoint's weights, optimizer, schedule, scaler, EMA and stateful objects, and
        where the run stopped (its random state is restored later, after the skipped batches are replayed)."""
        cfg = self.cfg
        if not cfg.resume:
            return
        state = load_checkpoint(cfg.ckpt_path, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler,
                                scaler=self.scaler, map_location=self.device, restore_rng=False)
        saved_total = state["extra"].get("total_steps", self.total)
        if saved_total != self.total:
            raise ValueError(f"the checkpoint {cfg.ckpt_path} belongs to a run of {saved_total} steps, this one has "
                             f"{self.total}: resume with the same --steps/--epochs (the LR schedule depends on it)")
        if self.ema is not None:
            if state["extra"].get("ema") is None:
                raise ValueError(f"the checkpoint {cfg.ckpt_path} has no EMA weights: resume with the ema_decay "
                                 "of the run that wrote it")
            self.ema.load_state_dict(state["extra"]["ema"])
        for key, obj in self.stateful.items():
            if key in state["extra"].get("stateful", {}):
                obj.load_state_dict(state["extra"]["stateful"][key])
        self.step, self.epoch, self.skip = state["step"], state["epoch"], state["batch_in_epoch"]
        self.result.records.append({"event": "resumed", "step": self.step, "epoch": self.epoch})
        self.saved = state

    def start_tracking(self, track_params: dict[str, Any] | None) -> None:
        """The run's hyper-parameters to TensorBoard and MLflow (main process only), when a tracking folder is set."""
        if self.tracking_dir is None or not is_main_process():
            return
        params = {k: v for k, v in asdict(self.cfg).items() if k not in ("tracking_dir", "run_name", "progress")}
        params.update(total_steps=self.total, device=str(self.device),
                      batch_transform=repr(self.batch_transform) if self.batch_transform is not None else None)
        params.update(track_params or {})
        self.tracker = Tracker(self.tracking_dir, params, run_name=self.cfg.run_name)
        self.result.tracking_run_id = self.tracker.run_id

    def start(self) -> None:
        """The callbacks' ``on_train_start``, the progress bar, the batch log's heartbeat."""
        from tqdm.auto import tqdm

        self.loop_state = LoopState(model=self.model, optimizer=self.optimizer, total_steps=self.total,
                                    step=self.step, epoch=self.epoch)
        for cb in self.callbacks:
            cb.on_train_start(self.loop_state)
        self.bar = tqdm(total=self.total, initial=self.step, desc="train", disable=not self.cfg.progress, leave=False)
        # in a batch log (text progress, see dlo.runtime.progress): a line per epoch, and without a bar a line at most
        # every 30 s, whatever log_every is (it reads no loss: no synchronisation)
        self.logged = progress.text_mode() and is_main_process()
        self.heartbeat = progress.Heartbeat() if self.logged and not self.cfg.progress else None

    def epochs(self) -> None:
        """The epoch loop, under the stop signals; the tracker is closed whatever happens."""
        self.model.train()
        self.t_start = time.perf_counter()
        status = "FAILED"
        try:
            with StopSignal() as stop:
                while self.step < self.total:
                    if self._epoch(stop):
                        break
            status = "KILLED" if self.result.stopped_by else "FINISHED"
        finally:
            self.bar.close()
            if self.tracker is not None:
                self.tracker.close(status, {"time/train_s": time.perf_counter() - self.t_start,
                                            "train/steps": self.step})

    def _epoch(self, stop: StopSignal) -> bool:
        """One epoch (or what is left of it after a resume); True when the run stops here."""
        cfg = self.cfg
        batch_size = self.batch_at(self.epoch)
        it, n_batches = _iter_epoch(self.make_loader, cfg.seed, self.epoch, self.skip, batch_size)
        side = resolution_at(cfg.resize_schedule, self.epoch) if cfg.resize_schedule is not None else None
        lr_factor = batch_size / self.first_batch if cfg.scale_lr_with_batch else 1.0
        if self.saved is not None:  # restore the random state only after replaying the skipped batches
            set_rng_state(self.saved["rng"])
            self.saved = None
        b = self.skip
        t_epoch = time.perf_counter()
        loss_sum, loss_steps = torch.zeros((), device=self.device), 0  # the epoch's mean loss, read once
        for images, labels in it:
            loss = self._step(images, labels, side, lr_factor)
            b += 1
            loss_sum += loss.detach().float()
            loss_steps += 1
            due = stop or self.step == self.total or (cfg.ckpt_every and self.step % cfg.ckpt_every == 0)
            if cfg.ckpt_path and due:
                self._checkpoint(done_epoch=b == n_batches, b=b)
            if stop:
                self.result.stopped_by = stop.received
                self.result.records.append({"event": "stopped", "signal": stop.received, "step": self.step})
                break
            if self.step >= self.total:
                break
        if self.result.stopped_by:
            return True
        if b != n_batches:
            self.skip = b
            return False
        record = self._epoch_record(t_epoch, loss_sum, loss_steps, batch_size, side)
        if self._epoch_end(record):
            return True
        self.epoch, self.skip = self.epoch + 1, 0
        return False

    def _step(self, images: torch.Tensor, labels: Any, side: int | None, lr_factor: float) -> torch.Tensor:
        """One optimizer step on one batch (resized, transformed), then the EMA, schedule, callbacks and logs."""
        cfg, optimizer = self.cfg, self.optimizer
        images, labels = images.to(self.device, non_blocking=True), _to_device(labels, self.device)
        if side is not None:
            images = resize_batch(images, side)
        if self.batch_transform is not None:
            images, labels = self.batch_transform(images, labels)
        if cfg.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        if lr_factor != 1.0:  # the scheduler keeps its own values: scale for this step only
            scheduled = [g["lr"] for g in optimizer.param_groups]
            for g in optimizer.param_groups:
                g["lr"] = g["lr"] * lr_factor
        lr = optimizer.param_groups[0]["lr"]  # the rate this step uses
        loss = self.step_fn(images, labels)
        if lr_factor != 1.0:
            for g, v in zip(optimizer.param_groups, scheduled):
                g["lr"] = v
        if self.ema is not None:
            self.ema.update_parameters(unwrap_model(self.model))
        if self.scheduler is not None:
            self.scheduler.step()
        self.step += 1
        self.loop_state.step, self.loop_state.epoch = self.step, self.epoch
        for cb in self.callbacks:
            cb.on_step_end(self.loop_state, loss)
        self.bar.update(1)
        if self.heartbeat is not None:
            self.heartbeat.beat(lambda: f"train: step {self.step}/{self.total} (epoch {self.epoch + 1}), "
                                        f"{time.perf_counter() - self.t_start:.0f} s")
        if self.step % cfg.log_every == 0 or self.step == self.total:
            self._log_step(loss, lr)
        return loss

    def _log_step(self, loss: torch.Tensor, lr: float) -> None:
        loss_value = loss.item()  # one synchronisation every log_every steps, not every step
        self.result.records.append({"event": "train", "step": self.step, "epoch": self.epoch, "loss": loss_value,
                                    "lr": lr})
        self.bar.set_postfix(loss=f"{loss_value:.3f}")
        if self.tracker is not None:
            self.tracker.log({"train/loss": loss_value, "train/lr": lr}, self.step)
        if self.on_step is not None:
            self.on_step(self.step, loss_value)

    def _checkpoint(self, *, done_epoch: bool, b: int) -> None:
        """An atomic checkpoint of everything an exact resume needs; a finished epoch resumes at the next one."""
        save_checkpoint(self.cfg.ckpt_path, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler,
                        scaler=self.scaler, step=self.step, epoch=self.epoch + done_epoch,
                        batch_in_epoch=0 if done_epoch else b, total_steps=self.total,
                        stateful={k: obj.state_dict() for k, obj in self.stateful.items()},
                        **({"ema": self.ema.state_dict()} if self.ema is not None else {}))
        self.result.checkpoint = self.cfg.ckpt_path

    def _epoch_record(self, t_epoch: float, loss_sum: torch.Tensor, loss_steps: int, batch_size: int | None,
                      side: int | None) -> dict[str, Any]:
        """The finished epoch's record: its time, mean training loss and, when asked, the validation metrics."""
        cfg = self.cfg
        synchronize(self.device)  # the GPU may still be running the last steps: count them in the epoch
        record = {"event": "epoch", "epoch": self.epoch, "step": self.step, "seconds": time.perf_counter() - t_epoch}
        if loss_steps:  # steps of this epoch run in this process (a resumed epoch counts its own)
            record["train_loss"] = loss_sum.item() / loss_steps
        if batch_size is not None:
            record["batch_size"] = batch_size
        if side is not None:
            record["resolution"] = side
        if self.val_loader is not None and cfg.eval_every_epoch:
            t_eval = time.perf_counter()
            metrics = evaluate(self.eval_model, self.val_loader, self.device, self.dtype, cfg.channels_last,
                               **({"tta": True} if cfg.tta else {}))
            record.update(val_loss=metrics["loss"], val_accuracy=metrics["accuracy"],
                          eval_seconds=time.perf_counter() - t_eval)
        return record

    def _epoch_end(self, record: dict[str, Any]) -> bool:
        """The epoch's record logged, then early stopping and every callback's ``on_epoch_end`` (all of them, in
        order, even after one asked to stop); True when the run stops here."""
        step, epoch = self.step, self.epoch
        self.result.records.append(record)
        if self.logged:
            print(_epoch_line(record, self.cfg.epochs, self.total), flush=True)
        if self.tracker is not None:
            self.tracker.log({f"val/{k[4:]}" if k.startswith("val_") else f"epoch/{k}": v
                              for k, v in record.items() if k not in ("event", "epoch", "step")}
                             | {"time/train_s": time.perf_counter() - self.t_start}, epoch)
        if self.early is not None and self.early.step(record["val_accuracy"], self.eval_model) and step < self.total:
            self.result.records.append({"event": "early_stop", "epoch": epoch, "step": step,
                                        "best_epoch": self.early.best_index, "best_val_accuracy": self.early.best,
                                        "patience": self.early.patience})
            return True
        self.loop_state.step, self.loop_state.epoch = step, epoch
        asked = [bool(cb.on_epoch_end(self.loop_state, record)) for cb in self.callbacks]  # every callback runs
        if any(asked) and step < self.total:
            self.result.records.append({"event": "stopped_early", "epoch": epoch, "step": step})
            return True
        return False

    def finish(self) -> TrainResult:
        """The best model kept by early stopping (not the last one), and the result."""
        early, result = self.early, self.result
        if early is not None and early.best_index is not None and not result.stopped_by:
            early.restore_best(self.eval_model)  # keep the best model seen, not the last one
            result.records.append({"event": "restored_best", "epoch": early.best_index, "val_accuracy": early.best})
        result.step = self.step
        result.model = self.model
        result.ema_model = self.ema
        return result
