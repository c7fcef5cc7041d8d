"""Hyper-parameter optimisation lesson (Jour4/hpo.ipynb): Optuna samplers and pruners, a study shared by
worker processes through a journal file, Ray Tune.

The CIFAR trainer (``.trainer``) loads on first use: it imports torch and torchvision (seconds), which a journal
worker (``dlo hpo worker``, a process per worker, on a toy function) never needs.
"""
from __future__ import annotations

import importlib

from .toys import rosenbrock, himmelblau, ToyFunction, TOY_FUNCTIONS, toy_function, best_so_far
from .space import (
    SearchSpaceError, validate_space, parse_space_json, suggest, grid, to_optuna, to_ray, clip_to_space,
    DuplicateParameterError, StrictTrial,
)
from .journal import (
    JournalPathError, LOCK_GRACE_S, journal_storage, fail_dead_trials, run_worker, launch_workers, study_summary,
    main,
)
from .ray import (
    ray_temp_dir, private_dir, private_token, ray_start, tune_progress, pbt_mutations, KeepInSpace, pbt_scheduler,
    pbt_exploits, ray_summary,
)

__all__ = [
    "rosenbrock",
    "himmelblau",
    "ToyFunction",
    "TOY_FUNCTIONS",
    "toy_function",
    "best_so_far",
    "SearchSpaceError",
    "validate_space",
    "parse_space_json",
    "suggest",
    "grid",
    "to_optuna",
    "to_ray",
    "clip_to_space",
    "DuplicateParameterError",
    "StrictTrial",
    "JournalPathError",
    "LOCK_GRACE_S",
    "journal_storage",
    "fail_dead_trials",
    "run_worker",
    "launch_workers",
    "study_summary",
    "main",
    "TRIAL_KEYS",
    "load_cifar_tensors",
    "load_cifar_test_tensors",
    "HPARAMS",
    "Trainer",
    "ray_temp_dir",
    "private_dir",
    "private_token",
    "ray_start",
    "tune_progress",
    "pbt_mutations",
    "KeepInSpace",
    "pbt_scheduler",
    "pbt_exploits",
    "ray_summary",
]


_TRAINER = ("TRIAL_KEYS", "load_cifar_tensors", "load_cifar_test_tensors", "HPARAMS", "Trainer")


def __getattr__(name: str):
    """The trainer's names, importing ``.trainer`` (and torch) on first use."""
    if name in _TRAINER:
        value = getattr(importlib.import_module(f"{__name__}.trainer"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
