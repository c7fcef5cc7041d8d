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
                expect(dist == want, f"{name}: expected suggest_float({name!r}, {low}, {high}"
                                      f"{', log=True' if log else ''}), got {dist}")
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


@register("hpo", "report_prune", ("train_and_report",), HPO_NB)
def _check_report_prune(train_and_report: Callable) -> str:
    import optuna
    from optuna.trial import TrialState

    curve = [0.2, 0.35, 0.5, 0.55]
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
        if reported == {i: a for i, a in enumerate(curve)}:
            raise CheckFailed("report at step = epochs trained so far (1, 2, ...), not from 0: the pruners "
                                 "count the resource (epochs) in these steps")
        expect(reported == want, f"report each epoch's accuracy with trial.report(accuracy, step=epoch): expected "
                                  f"{want}, the trial holds {reported}")
        expect(isinstance(value, float) and math.isclose(value, curve[-1]),
                f"return the last accuracy ({curve[-1]}), got {value!r}")
        study.tell(trial, value)

        # 2. A pruner that prunes below 0.3: stop right after the first report, by raising TrialPruned.
        study = optuna.create_study(direction="maximize", pruner=optuna.pruners.ThresholdPruner(lower=0.3))
        trial, trainer = study.ask(), _ScriptedTrainer(curve)
        pruned = False
        try:
            train_and_report(trial, trainer, len(curve))
        except optuna.TrialPruned:
            pruned = True
        expect(pruned, "ask trial.should_prune() after each report and raise optuna.TrialPruned() when it says so")
        expect(trainer.epoch == 1, f"stop as soon as the pruner says so: pruned after epoch 1, but "
                                    f"{trainer.epoch} epochs were trained")
        study.tell(trial, state=TrialState.PRUNED)
    return "reports every epoch at step 1, 2, ...; stops with TrialPruned as soon as the pruner says so"
