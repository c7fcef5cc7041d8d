"""Toy functions for the samplers lesson (Rosenbrock, Himmelblau) and best-so-far curves.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping



# --------------------------------------------------------------------------------------------------
# Toy functions
# --------------------------------------------------------------------------------------------------


def rosenbrock(x: float, y: float) -> float:
    """``(1 - x)² + 100 (y - x²)²``: one minimum, 0 at (1, 1), at the bottom of a long curved valley."""
    return (1.0 - x) ** 2 + 100.0 * (y - x * x) ** 2


def himmelblau(x: float, y: float) -> float:
    """``(x² + y - 11)² + (x + y² - 7)²``: four minima, all 0, e.g. at (3, 2)."""
    return (x * x + y - 11.0) ** 2 + (x + y * y - 7.0) ** 2


@dataclass(frozen=True)
class ToyFunction:
    """A 2-D function to minimise over a box, with its known minima (value 0)."""

    name: str
    fn: Callable[[float, float], float]
    bounds: Mapping[str, tuple[float, float]]
    minima: tuple[tuple[float, float], ...]

    def __call__(self, x: float, y: float) -> float:
        return self.fn(x, y)

    def objective(self, trial) -> float:
        """The Optuna objective: ``x`` and ``y`` each sampled under its own name, inside the box."""
        x = trial.suggest_float("x", *self.bounds["x"])
        y = trial.suggest_float("y", *self.bounds["y"])
        return self.fn(x, y)

    def grid(self, n_trials: int) -> dict[str, list[float]]:
        """A ``k × k`` grid with ``k = floor(sqrt(n_trials))``, at most ``n_trials`` points (for GridSampler)."""
        if not isinstance(n_trials, int) or isinstance(n_trials, bool) or n_trials < 4:
            raise ValueError(f"a grid needs n_trials >= 4 (2 x 2 points), got {n_trials!r}")
        k = math.isqrt(n_trials)
        return {name: [lo + (hi - lo) * i / (k - 1) for i in range(k)] for name, (lo, hi) in self.bounds.items()}

    def mesh(self, n: int = 150):
        """``(X, Y, Z)`` numpy arrays over the box, for a contour plot."""
        import numpy as np

        (x0, x1), (y0, y1) = self.bounds["x"], self.bounds["y"]
        X, Y = np.meshgrid(np.linspace(x0, x1, n), np.linspace(y0, y1, n))
        return X, Y, self.fn(X, Y)


TOY_FUNCTIONS: dict[str, ToyFunction] = {
    "rosenbrock": ToyFunction("rosenbrock", rosenbrock, {"x": (-2.0, 2.0), "y": (-1.0, 3.0)}, ((1.0, 1.0),)),
    "himmelblau": ToyFunction("himmelblau", himmelblau, {"x": (-5.0, 5.0), "y": (-5.0, 5.0)},
                              ((3.0, 2.0), (-2.805118, 3.131312), (-3.779310, -3.283186), (3.584428, -1.848126))),
}


def toy_function(name: str) -> ToyFunction:
    if name not in TOY_FUNCTIONS:
        raise ValueError(f"unknown toy function {name!r}: choose one of {', '.join(TOY_FUNCTIONS)}")
    return TOY_FUNCTIONS[name]


def best_so_far(values: Iterable[float | None], direction: str = "minimize") -> list[float]:
    """Running best of a sequence of trial values (``None`` = a pruned or failed trial, skipped)."""
    if direction not in ("minimize", "maximize"):
        raise ValueError(f"direction must be 'minimize' or 'maximize', got {direction!r}")
    better = min if direction == "minimize" else max
    out: list[float] = []
    best = math.nan
    for v in values:
        if v is not None and not (isinstance(v, float) and math.isnan(v)):
            best = v if math.isnan(best) else better(best, v)
        out.append(best)
    return out
