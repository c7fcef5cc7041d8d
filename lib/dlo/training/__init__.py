"""Layer 5, training: one configuration (:class:`TrainConfig`), one optimisation step, ONE loop with
callbacks, evaluation, optimizers and schedules, atomic checkpoints with exact resume, experiment tracking.
"""
from __future__ import annotations

from .config import TrainConfig, field_docs
from .step import (
    AMP_DTYPES, amp_dtype, autocast_context, make_grad_scaler, make_train_step, check_device_options,
    prepare_model, soft_target_criterion,
)
from .evaluate import TTA_VIEWS, tta_probabilities, evaluate
from .callbacks import (
    check_schedule, resolution_at, batch_size_at, resize_batch, make_ema, EarlyStopping, Callback, LoopState,
    StopAtTarget, TrainMetric, FreezeNormStats,
)
from .checkpoint import (
    rng_state, set_rng_state, unwrap_model, save_checkpoint, read_checkpoint, check_model_shape, load_checkpoint,
    StopSignal,
)
from .loop import TrainResult, epoch_generator, train

__all__ = [
    "TrainConfig",
    "field_docs",
    "AMP_DTYPES",
    "amp_dtype",
    "autocast_context",
    "make_grad_scaler",
    "make_train_step",
    "check_device_options",
    "prepare_model",
    "soft_target_criterion",
    "TTA_VIEWS",
    "tta_probabilities",
    "evaluate",
    "check_schedule",
    "resolution_at",
    "batch_size_at",
    "resize_batch",
    "make_ema",
    "EarlyStopping",
    "Callback",
    "LoopState",
    "StopAtTarget",
    "TrainMetric",
    "FreezeNormStats",
    "rng_state",
    "set_rng_state",
    "unwrap_model",
    "save_checkpoint",
    "read_checkpoint",
    "check_model_shape",
    "load_checkpoint",
    "StopSignal",
    "TrainResult",
    "epoch_generator",
    "train",
]
