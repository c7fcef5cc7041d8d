"""Generated cases of the recipes checkers: progressive-resizing schedules, EMA runs, TTA models and batches.

The EMA runs: a small model (a Linear with a bias, a BatchNorm with its running statistics) in float32, bfloat16,
float16 or float64, decays 0, 0.5, 0.9, 0.999 and 1, one to five updates, the average kept in float32 for a 16-bit
model and in the model's own dtype otherwise, the weights given as the model's parameters (they require grad) and
buffers. Each update is compared with the exact float64 EMA within what the dtypes' rounding allows
(:func:`ema_tolerance`, summed over the updates).
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from torch import nn

from dlo.course.checks.cases import Case, seeded

# ------------------------------------------------------------------------------------------------ resize


def _schedule_case(schedule: list[tuple[int, int]], epoch: int, size: float) -> Case:
    return Case(f"schedule {schedule}, epoch {epoch}", {"schedule": schedule, "epoch": epoch}, size=size)


def _draw_schedule(rng: random.Random) -> Case:
    starts = [0] + sorted(rng.sample(range(1, 12), rng.randint(0, 4)))
    schedule = [(s, rng.choice((8, 12, 16, 20, 24, 28, 32, 48, 64))) for s in starts]
    epoch = rng.randint(0, starts[-1] + 3)
    return _schedule_case(schedule, epoch, 10 * len(schedule) + epoch)


def resize_cases() -> list[Case]:
    fixed = [([(0, 16), (2, 24), (4, 32)], range(7)), ([(0, 32)], range(3)), ([(0, 8), (1, 12), (5, 16)], range(7)),
             ([(0, 24), (2, 32), (5, 28)], range(8)), ([(0, 16), (3, 16), (4, 24)], range(6))]
    cases = [_schedule_case(list(s), e, 10 * len(s) + e) for s, epochs in fixed for e in epochs]
    return seeded(_draw_schedule, 40, seed=4, fixed=cases)


# ------------------------------------------------------------------------------------------------ EMA


class SmallNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.bn = nn.BatchNorm1d(3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.lin(x))


@dataclass(frozen=True)
class EmaRun:
    """One EMA run: the model's dtype, the decay, how many updates, a seed."""

    dtype: torch.dtype
    decay: float
    steps: int
    seed: int

    @property
    def average_dtype(self) -> torch.dtype:
        return torch.float32 if self.dtype in (torch.bfloat16, torch.float16) else self.dtype

    @property
    def label(self) -> str:
        model = str(self.dtype).replace("torch.", "")
        avg = str(self.average_dtype).replace("torch.", "")
        return f"a {model} model, a {avg} average, decay {self.decay:g}, {self.steps} update(s)"

    def start(self) -> tuple[list[str], nn.Module, list[torch.Tensor]]:
        """The tensors' names, the model (weights near 1, as after training) and the average's first value."""
        torch.manual_seed(self.seed)
        model = SmallNet()
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(0.05).add_(1.0)
        model = model.to(self.dtype)
        names = [k for k, t in model.state_dict().items() if t.dtype.is_floating_point]
        average = [t.detach().clone().to(self.average_dtype) for t in self.current(model)]
        return names, model, average

    def current(self, model: nn.Module) -> list[torch.Tensor]:
        """The model's weights as the student's function receives them: its parameters (requiring grad), then its
        floating-point buffers."""
        return [*model.parameters(), *(b for b in model.buffers() if b.dtype.is_floating_point)]

    def move(self, model: nn.Module, step: int) -> None:
        """One optimiser step's worth of change: every weight and statistic moves by about 0.2."""
        g = torch.Generator().manual_seed(self.seed * 100 + step)
        with torch.no_grad():
            for t in self.current(model):
                t.add_((0.2 + 0.05 * torch.randn(t.shape, generator=g)).to(t.dtype))


def ema_runs() -> list[EmaRun]:
    runs = [EmaRun(torch.float32, 0.9, 3, 0), EmaRun(torch.float32, 0.5, 1, 1), EmaRun(torch.float32, 0.0, 2, 2),
            EmaRun(torch.float32, 1.0, 2, 3), EmaRun(torch.float64, 0.9, 3, 4), EmaRun(torch.float64, 0.999, 5, 5),
            EmaRun(torch.bfloat16, 0.999, 5, 6), EmaRun(torch.float16, 0.999, 5, 7), EmaRun(torch.bfloat16, 0.9, 4, 8)]
    return runs


def ema_tolerance(average: torch.Tensor, current: torch.Tensor, decay: float, average_dtype: torch.dtype) -> torch.Tensor:
    """What one EMA update may differ by, element by element, from the exact float64 update: (1 - decay) x weights
    computed in the model's dtype (the natural ``decay * ema + (1 - decay) * w`` rounds that product to it), and the
    sum rounded to the average's dtype (a few ulps)."""
    model_eps, avg_eps = torch.finfo(current.dtype).eps, torch.finfo(average_dtype).eps
    return model_eps * (1 - decay) * current.double().abs() + 4 * avg_eps * average.double().abs()


# ------------------------------------------------------------------------------------------------ TTA


class Asym(nn.Module):
    """A linear classifier on the flattened image: not mirror-symmetric, so a flip changes its output."""

    def __init__(self, shape: tuple[int, int, int], classes: int, dtype: torch.dtype, seed: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        c, h, w = shape
        self.w = nn.Parameter(torch.randn(classes, c * h * w, generator=g).to(dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(1) @ self.w.T


def _tta_case(b: int, c: int, h: int, w: int, classes: int, dtype: torch.dtype, seed: int) -> Case:
    model = Asym((c, h, w), classes, dtype, seed)
    x = torch.randn(b, c, h, w, generator=torch.Generator().manual_seed(seed + 50)).to(dtype)
    name = str(dtype).replace("torch.", "")
    return Case(f"a batch of {b} {name} images of {c}x{h}x{w}, {classes} classes", {"model": model, "images": x},
                size=b * c * h * w)


def tta_cases() -> list[Case]:
    shapes = [(7, 3, 4, 6, 5, torch.float32), (1, 3, 5, 7, 4, torch.float32), (2, 1, 3, 3, 3, torch.float32),
              (4, 3, 9, 2, 6, torch.float64), (3, 2, 1, 5, 2, torch.float32), (5, 3, 7, 5, 10, torch.bfloat16),
              (1, 3, 4, 4, 3, torch.bfloat16), (6, 2, 6, 8, 7, torch.float64)]
    return sorted((_tta_case(*s, seed=i) for i, s in enumerate(shapes)), key=lambda c: c.size)
