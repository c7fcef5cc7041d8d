"""Checkers of the hyper-parameter search notebook (Jour4/hpo.ipynb), course ``hpo``."""
from __future__ import annotations

import contextlib
import math
from typing import Callable, Iterator

from dlo.course.checks.framework import CheckFailed, expect, register

HPO_NB = "Jour4/hpo.ipynb"

# The space the exercise asks for: (low, high, log) per name.
EXPECTED_SPACE = {"lr": (1e-4, 1.0, True), "weight_decay": (1e-6, 1e-2, True), "momentum": (0.0, 0.99, False)}


@contextlib.contextmanager
def _quiet_optuna() -> Iterator[None]:
    import optuna

    old = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(old)


@register("hpo", "search_space", ("search_space",), HPO_NB)
def _check_search_space(search_space: Callable) -> str:
    import optuna
    from optuna.distributions import FloatDistribution

    with _quiet_optuna():
        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
        lrs, wds = [], []
        for _ in range(20):
            trial = study.ask()
            values = search_space(trial)
            expect(isinstance(values, dict), f"return a dict {{name: value}}, got {type(values).__name__}")
            expect(set(values) == set(EXPECTED_SPACE),
                    f"return the keys {sorted(EXPECTED_SPACE)}, got {sorted(values)}")
            sampled = set(trial.params)
            expect(sampled == set(EXPECTED_SPACE),
                    f"sample each hyper-parameter under its own name {sorted(EXPECTED_SPACE)}; the trial sampled "
                    f"{sorted(sampled)} (a name used twice ties two hyper-parameters to one value)")
            for name, (low, high, log) in EXPECTED_SPACE.items():
                dist = trial.distributions[name]
                want = FloatDistribution(low, high, log=log)
                scale = ""
                if getattr(dist, "log", log) != log:
                    scale = (f": {name} spans decades, sample it on a log scale" if log else
                             f": {name} lies in [{low}, {high}] and spans no decades, sample it on a linear scale")
                expect(dist == want, f"{name}: expected a float in [{low}, {high}]{' on a log scale' if log else ''},"
                                     f" got {dist}{scale}")
                expect(values[name] == trial.params[name],
                        f"return under {name!r} the value sampled as {name!r} (got {values[name]!r}, sampled "
                        f"{trial.params[name]!r})")
            lrs.append(values["lr"])
            wds.append(values["weight_decay"])
            study.tell(trial, 0.0)
    expect(any(a != b for a, b in zip(lrs, wds)), "lr and weight_decay are always equal: sample them under two names")
    return "three hyper-parameters, three names, log scales for lr and weight decay"


class _ScriptedTrainer:
    """A stand-in for hpo.Trainer: train_epoch() returns the next scripted accuracy."""

    def __init__(self, accuracies: list[float]) -> None:
        self.accuracies = list(accuracies)
        self.epoch = 0

    def train_epoch(self) -> float:
        if self.epoch >= len(self.accuracies):
            raise CheckFailed("train_epoch() called more times than the number of epochs")
        self.epoch += 1
        return self.accuracies[self.epoch - 1]


def _report_mistake(reported: dict, curve: list[float]) -> str:
    """What a wrong set of reported values is, in words ("" when unknown)."""
    if reported == {i: a for i, a in enumerate(curve)}:
        return ("report at step = epochs trained so far (1, 2, ...), not from 0: the pruners count the resource "
                "(epochs) in these steps")
    best = {i + 1: max(curve[:i + 1]) for i in range(len(curve))}
    if reported == best:
        return ("you report the best accuracy so far, not each epoch's: the pruner compares what this epoch "
                "measured with the other trials at the same step")
    if len(reported) == 1:
        return "you report once: report after every epoch, so that the pruner can stop the trial early"
    return ""


#: a curve that rises, drops and rises again: its best (0.55) is not its last (0.5), and a pruner that prunes
#: below 0.3 lets the first two epochs pass and stops the trial at the third
_CURVE = [0.35, 0.55, 0.25, 0.5]


@register("hpo", "report_prune", ("train_and_report",), HPO_NB)
def _check_report_prune(train_and_report: Callable) -> str:
    import optuna
    from optuna.trial import TrialState

    curve = _CURVE
    with _quiet_optuna():
        # 1. Nothing pruned: every epoch reported at step 1, 2, ..., the last accuracy returned.
        study = optuna.create_study(direction="maximize", pruner=optuna.pruners.NopPruner())
        trial, trainer = study.ask(), _ScriptedTrainer(curve)
        try:
            value = train_and_report(trial, trainer, len(curve))
        except optuna.TrialPruned:
            raise CheckFailed("pruned although the pruner never prunes") from None
        expect(trainer.epoch == len(curve), f"train {len(curve)} epochs (trainer.train_epoch() called "
                                             f"{trainer.epoch} times)")
        reported = study.trials[0].intermediate_values
        want = {i + 1: a for i, a in enumerate(curve)}
        why = _report_mistake(reported, curve)
        expect(reported == want, why or f"report each epoch's accuracy at its epoch number: expected {want}, the "
                                        f"trial holds {reported}")
        returned_best = isinstance(value, float) and math.isclose(value, max(curve))
        expect(isinstance(value, float) and math.isclose(value, curve[-1]),
               f"return the last epoch's accuracy ({curve[-1]}), got {value!r}"
               + (": that is the best one; the trial's value is the model it ends with" if returned_best else ""))
        study.tell(trial, value)

        # 2. A pruner that prunes below 0.3: stopped at once after the epoch under it (the third, then the last)
        for scripted, stop in ((curve, 3), (curve[:2] + [0.5, 0.2], 4)):
            study = optuna.create_study(direction="maximize", pruner=optuna.pruners.ThresholdPruner(lower=0.3))
            trial, trainer = study.ask(), _ScriptedTrainer(scripted)
            pruned = False
            try:
                train_and_report(trial, trainer, len(scripted))
            except optuna.TrialPruned:
                pruned = True
            expect(pruned, f"accuracies {scripted}: the pruner said to stop after epoch {stop} (accuracy "
                           f"{scripted[stop - 1]} under its threshold 0.3) but no optuna.TrialPruned was raised: ask "
                           "the trial whether to prune after each report, and raise it when told to")
            expect(trainer.epoch == stop, f"accuracies {scripted}: stop as soon as the pruner says so: it says so "
                                          f"after epoch {stop}, but {trainer.epoch} epochs were trained")
            study.tell(trial, state=TrialState.PRUNED)
    return ("reports each epoch's accuracy at step 1, 2, ...; returns the last one (not the best); stops with "
            "TrialPruned as soon as the pruner says so")
