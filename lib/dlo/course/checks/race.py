"""Checkers of the CIFAR-10 race notebook (course ``race``, Jour4/cifar_race.ipynb)."""
from __future__ import annotations

from typing import Callable

from dlo.course.checks.framework import expect, register
from dlo.lessons import race

RACE_NB = "Jour4/cifar_race.ipynb"

# (times, accuracies, target): first reach, exact equality, a curve that goes down again, never, empty.
_CURVES = [
    ([1.0, 2.0, 3.0], [0.2, 0.7, 0.9], 0.5),
    ([1.0, 2.0, 3.0], [0.2, 0.5, 0.9], 0.5),
    ([0.5, 1.5, 2.5, 3.5], [0.3, 0.96, 0.91, 0.97], 0.94),
    ([1.0, 2.0], [0.1, 0.4], 0.5),
    ([], [], 0.5),
    ([4.0], [1.0], 1.0),
]


@register("race", "time_to_target", ("time_to_target",), RACE_NB)
def _check_time_to_target(time_to_target: Callable) -> str:

    for times, accs, target in _CURVES:
        want = race.time_to_target(times, accs, target)
        got = time_to_target(list(times), list(accs), target)
        first = next((i for i, a in enumerate(accs) if a >= target), None)
        expect(first is None or got != first or got == want,
               f"times={times}, accuracies={accs}, target={target}: you return {got!r}, the index of the evaluation "
               f"that reached the target: return its time, times[i] = {want!r}")
        expect(got == want if want is None or got is None else abs(got - want) < 1e-12,
                f"times={times}, accuracies={accs}, target={target}: expected {want!r}, got {got!r}"
                + (" (the FIRST time the target is reached, with >=)" if want is not None else
                   " (None when the target is never reached)"))
    return "the first evaluation that shows the target wins the race; None if none does"


SMOKE_BUDGET_S = 60.0  # seconds on the race clock for the checker's smoke race (the reference needs ~10 on 2 cores)


@register("race", "my_recipe", ("my_recipe",), RACE_NB)
def _check_my_recipe(my_recipe: Callable) -> str:

    base = race.smoke_recipe()
    recipe = my_recipe(base)
    expect(isinstance(recipe, race.Recipe),
            f"my_recipe(base) must return a dlo.lessons.race.Recipe (e.g. base.replace(...)), got {type(recipe).__name__}")
    changed = sorted(k for k, v in recipe.to_dict().items() if k != "name" and v != getattr(base, k))
    expect(bool(changed), "your recipe is the reference itself: change at least one ingredient (base.replace(...))")
    expect(recipe.name != base.name, f"give your recipe its own name (it is {recipe.name!r}, the reference's): "
                                      "base.replace(name='mine', ...)")
    expect(recipe.width <= 16 and recipe.epochs <= 12 and not recipe.compile,
            "for the smoke race on a CPU keep width <= 16, epochs <= 12 and compile=False (it would take minutes)")
    expect(not recipe.cudnn_benchmark, "the smoke race runs on a CPU: cudnn_benchmark=True needs a CUDA GPU")
    record = race.run_race(recipe, race.SMOKE_TARGET, generated=True, device="cpu", time_budget_s=SMOKE_BUDGET_S,
                           progress=False, verbose=False)
    expect(record["reached"], f"your recipe did not reach the smoke target {race.SMOKE_TARGET:.0%} "
                               f"(best {record['best_accuracy']:.1%} after {record['epochs_run']} epochs, "
                               f"{record['total_s']:.1f} s, stopped by {record['stopped_by']})")
    return (f"a valid recipe (changed: {', '.join(changed)}) that reached {race.SMOKE_TARGET:.0%} on the smoke task "
            f"in {record['time_to_target_s']:.1f} s ({record['epochs_to_target']} epochs)")
