"""The training configuration: every switch of the loop, documented and validated.

:class:`TrainConfig` is the one configuration family of the package: the loop (:func:`dlo.training.loop.train`)
reads it, the command line (``dlo train``) builds it, and the lessons extend it (the race's
:class:`dlo.lessons.race.Recipe` is a ``TrainConfig`` plus the race's own fields). Each field is documented by
the string under it; ``__post_init__`` checks every field and refuses a bad value in one line.
"""
from __future__ import annotations

import ast
import inspect
import textwrap
from dataclasses import dataclass, fields

from dlo.runtime.validate import is_int, is_number
from dlo.training.callbacks import check_schedule
from dlo.training.optim import OPTIMIZERS, SCHEDULES
from dlo.training.step import amp_dtype






@dataclass
class TrainConfig:
    """Every switch of the training loop; see each field's documentation (``help(TrainConfig)``)."""

    epochs: int = 1
    """Epochs the schedule spans (the run does them all unless ``steps`` or a callback stops it)."""
    steps: int | None = None
    """Stop after this many optimizer steps (the LR schedule then spans them); None: ``epochs`` full epochs."""
    lr: float = 0.05
    """Peak learning rate of the schedule."""
    momentum: float = 0.9
    """Momentum of SGD-like optimizers (and onecycle's cycled momentum), in [0, 1)."""
    weight_decay: float = 5e-4
    """Weight decay, applied to weights only: biases and normalisation parameters are excluded."""
    optimizer: str = "sgd_nesterov"
    """A name of :func:`dlo.training.optim.make_optimizer` (sgd, sgd_nesterov, adam_l2, adamw, lamb, lars, lion)."""
    schedule: str | None = "onecycle"
    """A name of :func:`dlo.training.optim.make_scheduler`, stepped once per optimizer step; None: constant lr."""
    warmup_steps: int = 0
    """Warm-up steps of ``warmup_cosine`` (and of the other schedules that take one)."""
    warmup_frac: float | None = None
    """Fraction of the steps spent warming up (onecycle's rising phase); overrides ``warmup_steps``. None:
    ``warmup_steps``, and 0.25 for onecycle."""
    betas: tuple[float, float] | None = None
    """(beta1, beta2) of Adam-like optimizers and Lion; None: the optimizer's default."""
    accum_steps: int = 1
    """Micro-batches per optimizer step (gradient accumulation): the batch is cut into that many pieces."""
    early_stopping: int | None = None
    """Patience in epochs on the validation accuracy (needs a val_loader); the best weights are restored."""
    label_smoothing: float = 0.0
    """Label smoothing of the cross-entropy, in [0, 1)."""
    amp: str | None = None
    """Mixed precision: 'bf16' (autocast), 'fp16' (autocast + GradScaler) or None (fp32)."""
    channels_last: bool = False
    """NHWC memory layout for the model and the batches (faster convolutions on tensor cores)."""
    cudnn_benchmark: bool = False
    """Let cuDNN time its algorithms on the first calls (GPU only)."""
    compile: bool = False
    """torch.compile the model before training."""
    clip_grad_norm: float | None = None
    """Clip the gradients' global norm to this value (after unscaling with fp16); None: no clipping."""
    seed: int = 0
    """Seed of the weights' initialisation and of every epoch's shuffling (exact resume depends on it)."""
    log_every: int = 10
    """Steps between two training-loss records (each one reads the loss: a device synchronisation)."""
    eval_every_epoch: bool = True
    """Evaluate on the val_loader after each epoch."""
    ckpt_path: str | None = None
    """Checkpoint file, written every ``ckpt_every`` steps, at the end and on SIGTERM/SIGUSR1."""
    ckpt_every: int | None = None
    """Steps between periodic checkpoints; None: only on a signal and at the end."""
    resume: bool = False
    """Continue exactly from ``ckpt_path`` (same batches, same random numbers)."""
    progress: bool = True
    """Show a tqdm bar."""
    resize_schedule: list[tuple[int, int]] | None = None
    """Progressive resizing: [(first epoch, image side), ...] starting at epoch 0."""
    batch_schedule: list[tuple[int, int]] | None = None
    """Dynamic batch size: [(first epoch, batch size), ...] starting at epoch 0."""
    scale_lr_with_batch: bool = False
    """With ``batch_schedule``: the lr is scaled by batch / first batch (linear scaling rule)."""
    ema_decay: float | None = None
    """Keep an EMA of the weights with this decay (e.g. 0.99) and evaluate it instead of the raw model."""
    tta: bool = False
    """Evaluate with test-time augmentation (the image and its mirror, see :func:`dlo.training.evaluate.evaluate`)."""
    tracking_dir: str | None = None
    """TensorBoard + MLflow file store folder; None: $DLO_TRACKING_DIR if set, else no tracking."""
    run_name: str | None = None
    """The run's name in the tracking stores (default: run-<date-time>)."""

    def __post_init__(self) -> None:
        name = type(self).__name__
        if not is_int(self.epochs) or self.epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {self.epochs}")
        if self.steps is not None and (not is_int(self.steps) or self.steps < 1):
            raise ValueError(f"steps must be >= 1 (or None for whole epochs), got {self.steps}")
        if self.early_stopping is not None and (not is_int(self.early_stopping) or self.early_stopping < 1):
            raise ValueError(f"early_stopping is a patience in epochs (a positive integer) or None, got {self.early_stopping!r}")
        for key in ("accum_steps", "log_every"):
            if not is_int(getattr(self, key)) or getattr(self, key) < 1:
                raise ValueError(f"{name}.{key} must be a positive integer, got {getattr(self, key)!r}")
        if self.ckpt_every is not None and (not is_int(self.ckpt_every) or self.ckpt_every < 1):
            raise ValueError(f"{name}.ckpt_every must be a positive number of steps or None, got {self.ckpt_every!r}")
        if not is_int(self.seed) or self.seed < 0:
            raise ValueError(f"{name}.seed must be an integer >= 0, got {self.seed!r}")
        if not is_int(self.warmup_steps) or self.warmup_steps < 0:
            raise ValueError(f"{name}.warmup_steps must be an integer >= 0, got {self.warmup_steps!r}")
        if not is_number(self.lr) or self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        for key, low, high in (("momentum", 0.0, 1.0), ("label_smoothing", 0.0, 1.0)):
            value = getattr(self, key)
            if not is_number(value) or not low <= value < high:
                raise ValueError(f"{name}.{key} must be a number in [{low}, {high}), got {value!r}")
        if not is_number(self.weight_decay) or self.weight_decay < 0:
            raise ValueError(f"{name}.weight_decay must be a number >= 0, got {self.weight_decay!r}")
        if self.warmup_frac is not None and (not is_number(self.warmup_frac) or not 0 <= self.warmup_frac < 1):
            raise ValueError(f"{name}.warmup_frac must be a fraction in [0, 1) or None, got {self.warmup_frac!r}")
        if self.clip_grad_norm is not None and (not is_number(self.clip_grad_norm) or self.clip_grad_norm <= 0):
            raise ValueError(f"{name}.clip_grad_norm must be a number > 0 or None, got {self.clip_grad_norm!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {self.optimizer!r}: use one of {', '.join(OPTIMIZERS)}")
        if self.schedule is not None and self.schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.schedule!r}: use one of {', '.join(SCHEDULES)} (or None: constant)")
        if self.betas is not None and (len(tuple(self.betas)) != 2
                                       or not all(is_number(b) and 0 <= b < 1 for b in self.betas)):
            raise ValueError(f"{name}.betas must be two numbers in [0, 1) or None, got {self.betas!r}")
        amp_dtype(self.amp)
        for key in ("channels_last", "cudnn_benchmark", "compile", "eval_every_epoch", "resume", "progress",
                    "scale_lr_with_batch"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"{name}.{key} must be True or False, got {getattr(self, key)!r}")
        if self.resume and not self.ckpt_path:
            raise ValueError("resume=True needs ckpt_path (the checkpoint to resume from)")
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


def field_docs(cls: type) -> dict[str, str]:
    """``{field: its documentation}`` of a config dataclass (the string under each field), for ``--help``
    texts and tables."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not hasattr(klass, "__dataclass_fields__"):
            continue
        body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body
        for node, nxt in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(nxt, ast.Expr)
                    and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str)):
                docs[node.target.id] = " ".join(nxt.value.value.split())
    return {f.name: docs.get(f.name, "") for f in fields(cls)}
