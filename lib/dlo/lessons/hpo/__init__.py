"""Hyper-parameter optimisation lesson (Jour4/hpo.ipynb): Optuna samplers and pruners, a study shared by
worker processes through a journal file, Ray Tune.
"""
from __future__ import annotations

from .toys import rosenbrock, himmelblau, ToyFunction, TOY_FUNCTIONS, toy_function, best_so_far
from .space import (
    SearchSpaceError, validate_space, parse_space_json, suggest, grid, to_optuna, to_ray, clip_to_space,
    DuplicateParameterError, StrictTrial,
)
from .journal import (
    JournalPathError, LOCK_GRACE_S, journal_storage, fail_dead_trials, run_worker, launch_workers, study_summary,
    main,
)
from .trainer import TRIAL_KEYS, load_cifar_tensors, load_cifar_test_tensors, HPARAMS, Trainer
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
