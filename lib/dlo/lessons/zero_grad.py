"""What ``optimizer.zero_grad(set_to_none=...)`` costs, timed on its own.

Timing two whole training steps that differ only in ``set_to_none`` and calling the faster one better measures
the step's noise: a step of hundreds of milliseconds varies by more than the fraction of a millisecond that
zero_grad takes. So the call itself is timed: before each timed call the gradients are put back (untimed), as
a backward would have left them; the two settings are timed in turns (interleaved) and decided by the course's
rule (:func:`dlo.measure.conclude`); the sentence then says what share of a training step that difference is.
"""
from __future__ import annotations

from typing import Any

import torch

from dlo.measure import bench
from dlo.measure.bench import Measurement
from dlo.measure.decide import pair_decider


class _ZeroGradCall:
    """One zero_grad call; ``prepare()`` (untimed) gives every parameter a gradient again, as a backward does."""

    def __init__(self, optimizer: torch.optim.Optimizer, set_to_none: bool) -> None:
        self.optimizer, self.set_to_none = optimizer, set_to_none
        self.params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
        self.grads = [torch.ones_like(p) for p in self.params]
        self.calls = 0

    def prepare(self) -> None:
        for p, g in zip(self.params, self.grads):
            p.grad = g

    def __call__(self) -> None:
        self.calls += 1
        self.optimizer.zero_grad(set_to_none=self.set_to_none)


def _preparing(timer: bench.Timer) -> bench.Timer:
    def timed(fn: Any) -> float:
        prepare = getattr(fn, "prepare", None)
        if prepare is not None:
            prepare()  # outside the clock
        return timer(fn)
    return timed


def time_zero_grad(optimizer: torch.optim.Optimizer, *, device: torch.device | str = "cpu", repeats: int = 20,
                   max_repeats: int | None = None, warmup: bench.Warmup | int = bench.Warmup(),
                   progress: bool = False) -> dict[bool, Measurement]:
    """``{set_to_none: Measurement}`` of one ``optimizer.zero_grad(set_to_none=...)`` call, both settings timed
    interleaved, each call on freshly restored gradients (restored outside the timed region)."""
    calls = {flag: _ZeroGradCall(optimizer, flag) for flag in (False, True)}
    names = {flag: f"zero_grad(set_to_none={flag})" for flag in calls}
    cands = [bench.Candidate(names[flag], call, 1, device) for flag, call in calls.items()]
    ms = bench.measure_interleaved(cands, repeats=repeats, max_repeats=max_repeats, warmup=warmup, unit="calls/s",
                                   track_memory=False, progress=progress,
                                   timer=_preparing(bench.make_timer(device)),
                                   until=pair_decider(names[True], names[False]) if max_repeats else None)
    for p in calls[False].params:
        p.grad = None
    return {flag: ms[names[flag]] for flag in calls}


def share_sentence(ms: dict[bool, Measurement], step_s: float) -> str:
    """The two calls' medians against one training step of ``step_s`` seconds: what share of a step the choice
    can change at most (a plain reading, no verdict: the verdict is the decision rule's sentence)."""
    a, b = ms[True].median_s, ms[False].median_s
    return (f"zero_grad itself took {a * 1e3:.3g} ms with set_to_none=True and {b * 1e3:.3g} ms with "
            f"set_to_none=False (medians of the interleaved calls), against {step_s * 1e3:.3g} ms for a whole "
            f"training step: the two medians differ by {100 * abs(a - b) / step_s:.2g} % of a step.")
