"""Layer 5, training: one configuration (:class:`TrainConfig`), one optimisation step, ONE loop with
callbacks, evaluation, optimizers and schedules, atomic checkpoints with exact resume, experiment tracking.
"""
from __future__ import annotations

from .config import TrainConfig
from .step import (
    AMP_DTYPES, amp_dtype, autocast_context, make_grad_scaler, make_train_step, check_device_options,
    prepare_model, soft_target_criterion,
)
from .evaluate import TTA_VIEWS, tta_probabilities, evaluate
from .callbacks import check_schedule, resolution_at, batch_size_at, resize_batch, make_ema, EarlyStopping
from .checkpoint import rng_state, set_rng_state, unwrap_model, save_checkpoint, load_checkpoint, StopSignal
from .loop import TrainResult, epoch_generator, train

__all__ = [
    "TrainConfig",
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
    "rng_state",
    "set_rng_state",
    "unwrap_model",
    "save_checkpoint",
    "load_checkpoint",
    "StopSignal",
    "TrainResult",
    "epoch_generator",
    "train",
]
