"""Generated cases of the hyper-parameter search checkers (:mod:`dlo.course.checks.hpo`).

``report_prune``: scripted accuracy curves of 1 to 7 epochs, each run under one of Optuna's own pruners (none,
:class:`~optuna.pruners.ThresholdPruner` with warm-up steps and pruning intervals of 1, 2 and 3 epochs,
:class:`~optuna.pruners.MedianPruner` against a history of finished trials). The reference is Optuna's behaviour on
the lesson's loop (report at step = epochs trained, ask, raise): the student's loop and the reference run in two
identical fresh studies, and what Optuna recorded (reported steps and values, pruned or not, epochs trained, the
value returned) is compared. ``search_space``: the lesson's space sampled by Optuna's samplers (random and TPE,
several seeds) and at enqueued points on every bound.

The cases come from :func:`dlo.course.checks.cases.seeded` (fixed edge cases plus seeded draws, smallest first):
a pruned trial at the first report, one never pruned, one pruned at its last report, an interval that skips the
epoch under the threshold. Values are compared (Optuna records numbers, nothing is differentiated: no gradient
applies here).
"""
from __future__ import annotations

import contextlib
import math
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from dlo.course.checks.cases import Case, seeded
from dlo.course.checks.framework import CheckFailed

# The space the exercise asks for: (low, high, log) per name.
EXPECTED_SPACE = {"lr": (1e-4, 1.0, True), "weight_decay": (1e-6, 1e-2, True), "momentum": (0.0, 0.99, False)}


def optuna_or_say_so():
    """Optuna, or one CheckFailed line saying it is not installed here."""
    try:
        import optuna
    except ImportError:
        raise CheckFailed("this check needs Optuna, which is not installed here (pip install optuna)") from None
    return optuna


@contextlib.contextmanager
def quiet_optuna() -> Iterator[None]:
    optuna = optuna_or_say_so()
    old = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(old)


# --------------------------------------------------------------------------------------------------
# report_prune
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Pruning:
    """One pruning situation: the accuracies a trainer returns, Optuna's pruner, the finished trials before."""

    curve: tuple[float, ...]
    pruner: tuple  # ("nop",) | ("threshold", lower, warmup, interval) | ("median", warmup, interval)
    history: tuple[tuple[float, ...], ...] = ()

    def describe(self) -> str:
        kind = self.pruner[0]
        if kind == "nop":
            how = "a pruner that never prunes"
        elif kind == "threshold":
            _, lower, warmup, interval = self.pruner
            how = f"ThresholdPruner(lower={lower}, n_warmup_steps={warmup}, interval_steps={interval})"
        else:
            _, warmup, interval = self.pruner
            how = (f"MedianPruner(n_warmup_steps={warmup}, interval_steps={interval}) after "
                   f"{len(self.history)} finished trials")
        return f"{len(self.curve)} epoch(s) with accuracies {list(self.curve)} and {how}"

    def study(self):
        optuna = optuna_or_say_so()
        kind = self.pruner[0]
        if kind == "nop":
            pruner = optuna.pruners.NopPruner()
        elif kind == "threshold":
            pruner = optuna.pruners.ThresholdPruner(lower=self.pruner[1], n_warmup_steps=self.pruner[2],
                                                    interval_steps=self.pruner[3])
        else:
            pruner = optuna.pruners.MedianPruner(n_startup_trials=0, n_warmup_steps=self.pruner[1],
                                                 interval_steps=self.pruner[2])
        study = optuna.create_study(direction="maximize", pruner=pruner)
        for past in self.history:
            study.add_trial(optuna.trial.create_trial(
                value=past[-1], intermediate_values={i + 1: a for i, a in enumerate(past)}))
        return study


class ScriptedTrainer:
    """A stand-in for hpo.Trainer: train_epoch() returns the next scripted accuracy."""

    def __init__(self, accuracies) -> None:
        self.accuracies = list(accuracies)
        self.epoch = 0

    def train_epoch(self) -> float:
        if self.epoch >= len(self.accuracies):
            raise CheckFailed(f"train_epoch() called more than epochs = {len(self.accuracies)} times: train the number "
                              "of epochs given as the argument")
        self.epoch += 1
        return self.accuracies[self.epoch - 1]


@dataclass
class Outcome:
    """What Optuna recorded of one trial, and what the loop did."""

    reported: dict[int, float]
    pruned: bool
    trained: int
    value: Any = None
    problem: str = ""


def run_trial(train_and_report: Callable, case: Pruning) -> Outcome:
    """``train_and_report`` on a fresh study built for ``case``; what happened."""
    optuna = optuna_or_say_so()
    study = case.study()
    trial, trainer = study.ask(), ScriptedTrainer(case.curve)
    pruned, value = False, None
    try:
        value = train_and_report(trial, trainer, len(case.curve))
    except optuna.TrialPruned:
        pruned = True
    except NotImplementedError:
        raise
    except CheckFailed as exc:
        raise CheckFailed(f"with {case.describe()}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - any error of the answer is reported in one line
        first = (str(exc).splitlines() or [""])[0][:200]
        raise CheckFailed(f"with {case.describe()}: it raised {type(exc).__name__}: {first}") from None
    reported = dict(study.trials[-1].intermediate_values)
    return Outcome(reported, pruned, trainer.epoch, value)


def reference_train_and_report(trial, trainer, epochs):
    """The lesson's loop: report each epoch's accuracy at step = epochs trained, then ask, and raise when told."""
    import optuna

    last = float("nan")
    for epoch in range(1, epochs + 1):
        last = trainer.train_epoch()
        trial.report(last, step=epoch)
        if trial.should_prune():
            raise optuna.TrialPruned()
    return last


def _fixed(name: str, pruning: Pruning, size: float) -> Case:
    return Case(f"{name}: {pruning.describe()}", {"case": pruning}, size)


FIXED_PRUNING = [
    _fixed("pruned at the first report", Pruning((0.1, 0.6, 0.7), ("threshold", 0.3, 0, 1)), 1),
    _fixed("never pruned", Pruning((0.35, 0.55, 0.25, 0.5), ("nop",)), 2),
    # rises, drops, rises: the best (0.55) is not the last (0.5), the third epoch is under 0.3
    _fixed("pruned at the third epoch", Pruning((0.35, 0.55, 0.25, 0.5), ("threshold", 0.3, 0, 1)), 2),
    _fixed("pruned at the last report", Pruning((0.35, 0.55, 0.5, 0.2), ("threshold", 0.3, 0, 1)), 2),
    # interval 2 after one warm-up step: only steps 1, 3, 5 are judged; step 2 (under 0.3) is let through
    _fixed("pruning every other step", Pruning((0.4, 0.2, 0.6, 0.5, 0.1), ("threshold", 0.3, 1, 2)), 3),
]


def _draw_pruning(rng: random.Random) -> Case:
    epochs = rng.randint(1, 7)
    curve = tuple(round(rng.uniform(0.05, 0.95), 4) for _ in range(epochs))
    kind = rng.choice(["threshold", "threshold", "median", "nop"])
    warmup, interval = rng.randint(0, 2), rng.randint(1, 3)
    history: tuple = ()
    if kind == "threshold":
        pruner: tuple = ("threshold", round(rng.uniform(0.15, 0.6), 2), warmup, interval)
    elif kind == "median":
        pruner = ("median", warmup, interval)
        history = tuple(tuple(round(rng.uniform(0.2, 0.8), 4) for _ in range(7)) for _ in range(rng.randint(1, 3)))
    else:
        pruner = ("nop",)
    case = Pruning(curve, pruner, history)
    return Case(case.describe(), {"case": case}, size=10 + epochs)


PRUNING_CASES = seeded(_draw_pruning, 14, seed=11, fixed=FIXED_PRUNING)


# --------------------------------------------------------------------------------------------------
# search_space
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Sampling:
    """A study whose sampler proposes the points: ``sampler`` ("random" or "tpe") with ``seed``, and ``enqueued``
    points tried first (on the bounds of the space)."""

    sampler: str
    seed: int
    trials: int
    enqueued: tuple[dict, ...] = field(default_factory=tuple)

    def study(self):
        optuna = optuna_or_say_so()
        sampler = (optuna.samplers.RandomSampler(seed=self.seed) if self.sampler == "random"
                   else optuna.samplers.TPESampler(seed=self.seed, n_startup_trials=3))
        study = optuna.create_study(sampler=sampler)
        for point in self.enqueued:
            study.enqueue_trial(dict(point))
        return study


def _bounds(pick: Callable[[tuple], float]) -> dict:
    return {name: pick(spec) for name, spec in EXPECTED_SPACE.items()}


#: sampled trials first (a distribution of the wrong shape is named there), then the bounds, then TPE
SAMPLING_CASES = sorted([
    Case("the lower bound of every range", {"case": Sampling("random", 0, 1, (_bounds(lambda s: s[0]),))}, 2),
    Case("the upper bound of every range", {"case": Sampling("random", 0, 1, (_bounds(lambda s: s[1]),))}, 2),
    Case("mixed bounds (lr high, weight decay low, momentum high)", {"case": Sampling(
        "random", 0, 1, ({"lr": 1.0, "weight_decay": 1e-6, "momentum": 0.99},))}, 2),
    *[Case(f"20 trials of Optuna's RandomSampler(seed={s})", {"case": Sampling("random", s, 20)}, 1) for s in (0, 1)],
    Case("12 trials of Optuna's TPESampler(seed=0)", {"case": Sampling("tpe", 0, 12)}, 3),
], key=lambda c: c.size)
