"""Argument checks shared by the package, each failing with one line that says what to give instead.
"""
from __future__ import annotations
from typing import Any



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
