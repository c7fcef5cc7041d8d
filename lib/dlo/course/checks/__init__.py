"""Exercise checkers: the framework (``check``, ``check_notebook``) and one module per course notebook.
"""
from __future__ import annotations

from .framework import CheckFailed, Check, REGISTRY, register, expect, check, load_exercises, check_notebook

__all__ = [
    "CheckFailed",
    "Check",
    "REGISTRY",
    "register",
    "expect",
    "check",
    "load_exercises",
    "check_notebook",
]

# One module of checkers per course notebook; importing it registers its steps in REGISTRY.
from . import (  # noqa: E402,F401
    apis, attention, context, ddp, dp_scratch, experts, experts_dispatch, fsdp, grid, hpo, inference, jit, jour1,
    jour2, jour3, jour4, pipeline, race, recipes, shapes, tp, transfer,
)
