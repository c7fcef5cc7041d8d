"""The training configuration: every switch of the loop, documented and validated.
"""
from __future__ import annotations

from dataclasses import dataclass

from dlo.training.step import amp_dtype
from dlo.training.callbacks import check_schedule


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
    optimizer: str = "sgd_nesterov"  # any name of dlo.training.optim.make_optimizer
    schedule: str = "onecycle"  # any name of dlo.training.optim.make_scheduler, stepped once per optimizer step
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
