"""The record every step's hints are written in (kept apart so that the per-workshop modules and the package's
``__init__`` import it one way)."""
from __future__ import annotations

from typing import NamedTuple


class Hint(NamedTuple):
    """A step's goal and its three hint levels.

    - ``goal``: what the code must achieve and why, no code (the TODO comment of the student copy);
    - ``concept`` (level 1): the idea, and why it is the right one;
    - ``shape`` (level 2): the shape of the computation -- which quantities, in which order, what each depends
      on -- in words, without the code;
    - ``tools`` (level 3): pointers to the exact API (functions, classes, arguments) to use.
    """

    goal: str
    concept: str
    tools: str
    shape: str | None = None


def h(goal: str, concept: str, tools: str, shape: str | None = None) -> Hint:
    return Hint(goal, concept, tools, shape)
