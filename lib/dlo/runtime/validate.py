"""Argument checks shared by the package, each failing with one line that says what to give instead.
"""
from __future__ import annotations

import math
import numbers
from typing import Any



def is_int(value: Any) -> bool:
    """An integer (Python's or numpy's), and not a bool (``True`` is an ``int`` to Python, never a count or a
    size to us)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A finite int or float, not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value



def check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}; choose one of {', '.join(map(repr, choices))}")



def non_negative_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return value



def check_batch_divisible(global_batch: int, world_size: int) -> None:
    """Raise a one-line ``ValueError`` unless ``global_batch`` splits evenly over ``world_size`` ranks.

    With DDP each rank runs ``global_batch / world_size`` samples; an uneven split would make the
    "global batch" (and the learning rate tuned for it) quietly different from the one announced.
    """
    positive_int("global batch", global_batch)
    positive_int("world size", world_size)
    if global_batch % world_size:
        below = global_batch - global_batch % world_size
        above = below + world_size
        nearest = f"{below} or {above}" if below > 0 else f"{above}"
        raise ValueError(
            f"global batch {global_batch} is not divisible by world size {world_size}: "
            f"choose a multiple of {world_size} (e.g. {nearest}) or another number of processes"
        )



def per_rank_batch(global_batch: int, world_size: int) -> int:
    """Samples per rank for a given global batch (raises like :func:`check_batch_divisible` if uneven)."""
    check_batch_divisible(global_batch, world_size)
    return global_batch // world_size
