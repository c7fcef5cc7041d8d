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
    from tqdm.auto import tqdm

    device = torch.device(device)
    dtype = amp_dtype(cfg.amp)
    if batch_transform is not None and not callable(batch_transform):
        raise ValueError(f"batch_transform must be a callable (images, labels) -> (images, targets), got {batch_transform!r}")
    tracker = None
    tracking_dir = cfg.tracking_dir if cfg.tracking_dir is not None else (os.environ.get("DLO_TRACKING_DIR") or None)
    if tracking_dir is not None and is_main_process():

        check_writable(tracking_dir)  # fail before any work, not after the run
    torch.manual_seed(cfg.seed)
    model = prepare_model(model, device, channels_last=cfg.channels_last, cudnn_benchmark=cfg.cudnn_benchmark,
                          compile=cfg.compile)

    if cfg.early_stopping is not None and (val_loader is None or not cfg.eval_every_epoch):
        raise ValueError("early_stopping watches the validation accuracy: pass val_loader= and keep eval_every_epoch=True")
    if cfg.batch_schedule is not None:
        _check_loader_takes_batch_size(make_loader)
    if optimizer is None:
        optimizer = make_optimizer(cfg.optimizer, model, lr=cfg.lr, weight_decay=cfg.weight_decay,
                                   momentum=cfg.momentum, **({"betas": tuple(cfg.betas)} if cfg.betas is not None else {}))

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
    scheduler = None if cfg.schedule is None else make_scheduler(cfg.schedule, optimizer, total,
                                                                 **_schedule_options(cfg, total))
    scaler = make_grad_scaler(device, dtype)
    if criterion is None:
        criterion = (nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing) if batch_transform is None
                     else soft_target_criterion(cfg.label_smoothing))
    stateful = {f"callback{i}": cb for i, cb in enumerate(callbacks)}
    if batch_transform is not None and hasattr(batch_transform, "state_dict"):
        stateful["batch_transform"] = batch_transform
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
        for key, obj in stateful.items():
            if key in state["extra"].get("stateful", {}):
                obj.load_state_dict(state["extra"]["stateful"][key])
        step, epoch, skip = state["step"], state["epoch"], state["batch_in_epoch"]
        result.records.append({"event": "resumed", "step": step, "epoch": epoch})
    else:
        state = None

    if tracking_dir is not None and is_main_process():

        params = {k: v for k, v in asdict(cfg).items() if k not in ("tracking_dir", "run_name", "progress")}
        params.update(total_steps=total, device=str(device),
                      batch_transform=repr(batch_transform) if batch_transform is not None else None)
        params.update(track_params or {})
        tracker = Tracker(tracking_dir, params, run_name=cfg.run_name)
        result.tracking_run_id = tracker.run_id

    loop_state = LoopState(model=model, optimizer=optimizer, total_steps=total, step=step, epoch=epoch)
    for cb in callbacks:
        cb.on_train_start(loop_state)
    bar = tqdm(total=total, initial=step, desc="train", disable=not cfg.progress, leave=False)
    # in a batch log (text progress, see dlo.runtime.progress): a line per epoch, and without a bar a line at most
    # every 30 s, whatever log_every is (it reads no loss: no synchronisation)
    logged = progress.text_mode() and is_main_process()
    heartbeat = progress.Heartbeat() if logged and not cfg.progress else None
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
                loss_sum, loss_steps = torch.zeros((), device=device), 0  # the epoch's mean loss, read once
                for images, labels in it:
                    images, labels = images.to(device, non_blocking=True), _to_device(labels, device)
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
                        ema.update_parameters(unwrap_model(model))
                    if scheduler is not None:
                        scheduler.step()
                    step, b = step + 1, b + 1
                    loss_sum += loss.detach().float()
                    loss_steps += 1
                    loop_state.step, loop_state.epoch = step, epoch
                    for cb in callbacks:
                        cb.on_step_end(loop_state, loss)
                    bar.update(1)
                    if heartbeat is not None:
                        heartbeat.beat(lambda: f"train: step {step}/{total} (epoch {epoch + 1}), "
                                               f"{time.perf_counter() - t_start:.0f} s")
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
                                        stateful={k: obj.state_dict() for k, obj in stateful.items()},
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

                    synchronize(device)  # the GPU may still be running the last steps: count them in the epoch
                    record = {"event": "epoch", "epoch": epoch, "step": step,
                              "seconds": time.perf_counter() - t_epoch}
                    if loss_steps:  # steps of this epoch run in this process (a resumed epoch counts its own)
                        record["train_loss"] = loss_sum.item() / loss_steps
                    if batch_size is not None:
                        record["batch_size"] = batch_size
                    if side is not None:
                        record["resolution"] = side
                    if val_loader is not None and cfg.eval_every_epoch:
                        t_eval = time.perf_counter()
                        metrics = evaluate(eval_model, val_loader, device, dtype, cfg.channels_last,
                                           **({"tta": True} if cfg.tta else {}))
                        record.update(val_loss=metrics["loss"], val_accuracy=metrics["accuracy"],
                                      eval_seconds=time.perf_counter() - t_eval)
                    result.records.append(record)
                    if logged:
                        print(_epoch_line(record, cfg.epochs, total), flush=True)
                    if tracker is not None:
                        tracker.log({f"val/{k[4:]}" if k.startswith("val_") else f"epoch/{k}": v
                                     for k, v in record.items() if k not in ("event", "epoch", "step")}
                                    | {"time/train_s": time.perf_counter() - t_start}, epoch)
                    if early is not None and early.step(metrics["accuracy"], eval_model) and step < total:
                        result.records.append({"event": "early_stop", "epoch": epoch, "step": step,
                                               "best_epoch": early.best_index, "best_val_accuracy": early.best,
                                               "patience": early.patience})
                        break
                    loop_state.step, loop_state.epoch = step, epoch
                    if any([bool(cb.on_epoch_end(loop_state, record)) for cb in callbacks]) and step < total:
                        result.records.append({"event": "stopped_early", "epoch": epoch, "step": step})
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
