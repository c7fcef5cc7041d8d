"""Checkers of the hyper-parameter search notebook (Jour4/hpo.ipynb), course ``hpo``.

Both steps run the student's function on generated cases (:mod:`dlo.course.checks.hpo_cases`) and compare with
Optuna's own behaviour: ``search_space`` on trials proposed by Optuna's samplers and on enqueued points on every
bound (the distributions Optuna recorded, the values returned); ``report_prune`` in studies under Optuna's pruners
(what Optuna recorded and decided for the student's loop against the lesson's loop in an identical study).
Without Optuna the check says so in one line.
"""
from __future__ import annotations

import math
from typing import Callable

from dlo.course.checks.framework import CheckFailed, expect, register
from dlo.course.checks.hpo_cases import (EXPECTED_SPACE, PRUNING_CASES, SAMPLING_CASES, Outcome, Pruning,
                                         optuna_or_say_so, quiet_optuna, reference_train_and_report, run_trial)

HPO_NB = "Jour4/hpo.ipynb"


def _one_trial(search_space: Callable, trial, where: str, point: dict | None) -> dict:
    """The student's space on one trial: the checks of one call, the values returned."""
    from optuna.distributions import FloatDistribution

    try:
        values = search_space(trial)
    except (CheckFailed, NotImplementedError):
        raise
    except Exception as exc:  # noqa: BLE001 - any error of the answer is reported in one line
        raise CheckFailed(f"with {where}: it raised {type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}") \
            from None
    expect(isinstance(values, dict), f"return a dict {{name: value}}, got {type(values).__name__}")
    expect(set(values) == set(EXPECTED_SPACE), f"return the keys {sorted(EXPECTED_SPACE)}, got {sorted(values)}")
    sampled = set(trial.params)
    expect(sampled == set(EXPECTED_SPACE),
           f"sample each hyper-parameter under its own name {sorted(EXPECTED_SPACE)}; the trial sampled "
           f"{sorted(sampled)}" + (" (a name used twice ties two hyper-parameters to one value)"
                                   if sampled < set(EXPECTED_SPACE) else ""))
    for name, (low, high, log) in EXPECTED_SPACE.items():
        dist = trial.distributions[name]
        scale = ""
        if getattr(dist, "log", log) != log:
            scale = (f": {name} spans decades, sample it on a log scale" if log else
                     f": {name} lies in [{low}, {high}] and spans no decades, sample it on a linear scale")
        expect(dist == FloatDistribution(low, high, log=log),
               f"{name}: expected a float in [{low}, {high}]{' on a log scale' if log else ''}, got {dist}{scale}")
        expect(values[name] == trial.params[name],
               f"with {where}: return under {name!r} the value sampled as {name!r} (got {values[name]!r}, sampled "
               f"{trial.params[name]!r})")
        if point is not None:
            expect(values[name] == point[name], f"with {where}: {name} is {values[name]!r}, expected {point[name]!r}")
    return values


@register("hpo", "search_space", ("search_space",), HPO_NB)
def _check_search_space(search_space: Callable) -> str:
    optuna_or_say_so()
    pairs = []
    with quiet_optuna():
        for case in SAMPLING_CASES:
            sampling = case.kwargs["case"]
            study = sampling.study()
            for i in range(sampling.trials):
                trial = study.ask()
                point = sampling.enqueued[i] if i < len(sampling.enqueued) else None
                values = _one_trial(search_space, trial, case.label, point)
                pairs.append((values["lr"], values["weight_decay"]))
                study.tell(trial, 0.0)
    expect(any(a != b for a, b in pairs), "lr and weight_decay are always equal: sample them under two names")
    return (f"three hyper-parameters, three names, log scales for lr and weight decay, on {len(SAMPLING_CASES)} "
            "studies (Optuna's random and TPE samplers, every bound of the space)")


def _report_mistake(reported: dict, curve: list[float], trained: int) -> str:
    """What a wrong set of reported values is, in words ("" when not one of the known mistakes)."""
    seen = curve[:trained]
    if seen and reported == {i: a for i, a in enumerate(seen)}:
        return ("report at step = epochs trained so far (1, 2, ...), not from 0: the pruners count the resource "
                "(epochs) in these steps")
    best = {i + 1: max(seen[:i + 1]) for i in range(len(seen))}
    if reported == best:
        return ("you report the best accuracy so far, not each epoch's: the pruner compares what this epoch "
                "measured with the other trials at the same step")
    if len(reported) == 1 and len(seen) > 1:
        return "you report once: report after every epoch, so that the pruner can stop the trial early"
    return ""


def _first_report_difference(got: dict, want: dict) -> str:
    for step in sorted(set(got) | set(want)):
        if step not in got:
            return f"nothing reported at step {step}, expected {want[step]}"
        if step not in want:
            return f"a report at step {step} ({got[step]}), expected none there"
        if not math.isclose(got[step], want[step], rel_tol=1e-12, abs_tol=1e-12):
            return f"at step {step} the trial holds {got[step]!r}, expected {want[step]!r}"
    return ""


def _difference(got: Outcome, want: Outcome, case: Pruning) -> str:
    """How the student's trial differs from the reference's, in one line ("" when it does not)."""
    curve = list(case.curve)
    honest = {i + 1: a for i, a in enumerate(curve[:got.trained])}
    if not got.pruned and got.trained < len(curve) and want.pruned and got.trained == want.trained:
        return (f"stopped after epoch {got.trained} when the pruner said so, but returned instead of raising "
                "optuna.TrialPruned: Optuna then records a finished trial with a half-trained score")
    if got.reported != honest:
        return (_report_mistake(got.reported, curve, got.trained)
                or "report each epoch's accuracy at its epoch number: " + _first_report_difference(got.reported, honest))
    if not got.pruned and got.trained < min(want.trained + 1, len(curve)):
        return (f"epochs={len(curve)}, but the loop ended after {got.trained} epoch(s) without being pruned: train "
                "the number of epochs given as the argument")
    if want.pruned and not got.pruned:
        return (f"the pruner said to stop after epoch {want.trained} (accuracy {curve[want.trained - 1]}), but "
                f"{got.trained} epochs were trained and no optuna.TrialPruned was raised: ask the trial whether to "
                "prune after each report, and raise it when told to")
    if got.pruned and not want.pruned:
        return (f"optuna.TrialPruned raised after epoch {got.trained}, but the pruner never said to stop this "
                "trial: raise it only when trial.should_prune() says so")
    if got.trained != want.trained:
        if want.pruned:
            return (f"stop as soon as the pruner says so: it says so after epoch {want.trained}, but {got.trained} "
                    "epochs were trained")
        return f"train {len(curve)} epochs (trainer.train_epoch() called {got.trained} times)"
    if not want.pruned:
        value = got.value
        if not (isinstance(value, (int, float)) and math.isclose(value, curve[-1], rel_tol=1e-12)):
            best = (isinstance(value, (int, float)) and value != curve[-1] and math.isclose(value, max(curve)))
            return (f"return the last epoch's accuracy ({curve[-1]}), got {value!r}"
                    + (": that is the best one; the trial's value is the model it ends with" if best else ""))
    return ""


@register("hpo", "report_prune", ("train_and_report",), HPO_NB)
def _check_report_prune(train_and_report: Callable) -> str:
    optuna_or_say_so()
    with quiet_optuna():
        pruned = 0
        for case in PRUNING_CASES:
            pruning = case.kwargs["case"]
            want = run_trial(reference_train_and_report, pruning)
            got = run_trial(train_and_report, pruning)
            problem = _difference(got, want, pruning)
            if problem:
                raise CheckFailed(f"with {case.label}: {problem}")
            pruned += want.pruned
    return (f"reports each epoch's accuracy at step 1, 2, ...; returns the last one (not the best); stops with "
            f"TrialPruned as soon as Optuna's pruner says so ({len(PRUNING_CASES)} studies, {pruned} pruned)")
