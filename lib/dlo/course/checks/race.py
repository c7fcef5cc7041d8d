"""Checkers of the CIFAR-10 race notebook (course ``race``, Jour4/cifar_race.ipynb)."""
from __future__ import annotations

import copy
from typing import Callable

from dlo.course.checks.cases import Case, run_student
from dlo.course.checks.framework import CheckFailed, expect, register
from dlo.course.checks.race_cases import BOARDS, CURVES, reference_ranking, reference_time_to_target, sort_key
from dlo.lessons import race
from dlo.lessons import leaderboard as board

RACE_NB = "Jour4/cifar_race.ipynb"

def _time_difference(got, case: Case) -> str:
    """How the answer's time differs from the library's on ``case``, in one line ("" when it does not)."""
    times, accs, target = (case.kwargs[k] for k in ("times", "accuracies", "target"))
    want = reference_time_to_target(times, accs, target)
    if got is None or want is None:
        if got is want:
            return ""
    elif isinstance(got, (int, float)) and not isinstance(got, bool) and abs(got - want) < 1e-12:
        return ""
    first = next((i for i, a in enumerate(accs) if a >= target), None)
    if first is not None and got == first and got != want:
        return (f"you return {got!r}, the index of the evaluation that reached the target: return its time, "
                f"times[i] = {want!r}")
    strict = next((t for t, a in zip(times, accs) if a > target), None)
    if want is not None and got == strict and any(a == target for a in accs):
        return (f"expected {want!r}, got {got!r}: an evaluation exactly at the target reaches it (compare with >=)")
    return (f"expected {want!r}, got {got!r}" + (" (the FIRST time the target is reached, with >=)" if want is not None
                                                 else " (None when the target is never reached)"))


@register("race", "time_to_target", ("time_to_target",), RACE_NB)
def _check_time_to_target(time_to_target: Callable) -> str:
    for case in CURVES:
        got = run_student(time_to_target, case)
        problem = _time_difference(got, case)
        if problem:
            raise CheckFailed(f"with {case.label}: {problem}")
    return (f"the first evaluation that shows the target gives the time; None if none does ({len(CURVES)} curves: "
            "crossed between evaluations, exactly, at the first one, never, uneven intervals)")


#: training images the my_recipe check holds out and evaluates on (the smoke task trains on the others)
_CHECK_VAL = 256


def _follows_its_base(my_recipe: Callable, smoke: race.Recipe, mine: race.Recipe) -> None:
    """my_recipe on other bases (the full race's reference, the smoke one with other settings): what it leaves
    as the smoke base's must follow each base."""
    kept = {k for k, v in mine.to_dict().items() if k != "name" and v == getattr(smoke, k)}
    for label, base in (("base = race.reference_recipe()", race.reference_recipe()),
                        ("base = smoke_recipe().replace(lr=0.05, batch_size=96, epochs=9, seed=3)",
                         smoke.replace(lr=0.05, batch_size=96, epochs=9, seed=3))):
        other = my_recipe(copy.deepcopy(base))
        expect(isinstance(other, race.Recipe), f"with {label}: my_recipe(base) returned {type(other).__name__}, "
                                                "not a Recipe")
        for k in sorted(kept):
            if getattr(base, k) != getattr(smoke, k) and getattr(other, k) != getattr(base, k):
                raise CheckFailed(
                    f"with {label}: {k} is {getattr(other, k)!r}, not the base's {getattr(base, k)!r}"
                    + (": that is the smoke base's value: my_recipe ignores its base (start from base: "
                       "base.replace(...))" if getattr(other, k) == getattr(smoke, k) else
                       f" (on the smoke base you left {k} as the base's)"))


@register("race", "my_recipe", ("my_recipe",), RACE_NB)
def _check_my_recipe(my_recipe: Callable) -> str:

    base = race.smoke_recipe()
    given = copy.deepcopy(base)
    recipe = my_recipe(given)
    touched = sorted(k for k, v in given.to_dict().items() if v != getattr(base, k))
    expect(not touched, f"my_recipe changed the base recipe passed in ({', '.join(touched)}): return a new recipe "
                        "(base.replace(...)) and leave the reference as it is")
    expect(isinstance(recipe, race.Recipe),
            f"my_recipe(base) must return a dlo.lessons.race.Recipe (e.g. base.replace(...)), got {type(recipe).__name__}")
    changed = sorted(k for k, v in recipe.to_dict().items() if k != "name" and v != getattr(base, k))
    expect(bool(changed), "your recipe is the reference itself: change at least one ingredient (base.replace(...))")
    expect(recipe.name != base.name, f"give your recipe its own name (it is {recipe.name!r}, the reference's): "
                                      "base.replace(name='mine', ...)")
    expect(recipe.width <= 16 and recipe.epochs <= 12 and not recipe.compile,
            "for the smoke race on a CPU keep width <= 16, epochs <= 12 and compile=False (it would take minutes)")
    expect(not recipe.cudnn_benchmark, "the smoke race runs on a CPU: cudnn_benchmark=True needs a CUDA GPU")
    _follows_its_base(my_recipe, base, recipe)
    # raced on a validation split (training images held out; the test file is never opened: a check run again
    # and again must not choose anything on the test set), bounded by the recipe's epochs, not by a clock: on a
    # busy machine an epoch takes ten times longer, and a wall-time budget would fail a right answer
    record = race.validation_run(recipe, race.SMOKE_TARGET, _CHECK_VAL, generated=True, device="cpu",
                                 progress=False, verbose=False)
    final = record["final_accuracy"]
    expect(final >= race.SMOKE_TARGET,
           f"your recipe did not reach the smoke target {race.SMOKE_TARGET:.0%} on {_CHECK_VAL} held-out training "
           f"images: {final:.1%} after its {record['epochs_run']} epochs (best {record['best_accuracy']:.1%}"
           + (f", first reached after epoch {record['val_epochs_to_target']}, then below it again"
              if record["val_epochs_to_target"] is not None else "") + "); check its epochs with race.validation_run")
    return (f"a valid recipe (changed: {', '.join(changed)}) that reached {race.SMOKE_TARGET:.0%} on {_CHECK_VAL} "
            f"held-out training images of the smoke task ({final:.1%} after its {record['epochs_run']} epochs; the "
            "test set was not read)")


# --------------------------------------------------------------------------------------------------
# A fair leaderboard comparison
# --------------------------------------------------------------------------------------------------

def _why_not(entry: dict, mine: dict) -> str:
    """Why ``entry`` cannot be ranked with ``mine``, in words."""
    for field, what in (("n_test", "test images"), ("data", "data"), ("hardware", "hardware"), ("target", "target")):
        if entry.get(field) is None:
            return f"it was recorded without its {field} (nothing says what it can be compared with)"
        if entry[field] != mine[field]:
            if field == "n_test" and entry["n_test"] > mine["n_test"]:
                return (f"it was evaluated on {entry['n_test']:,} test images and yours on {mine['n_test']:,}: "
                        "another measurement, not comparable with yours")
            if field == "n_test":
                return (f"it was evaluated on {entry['n_test']:,} test images and yours on {mine['n_test']:,}: an "
                        f"accuracy on {entry['n_test']:,} images moves by {100 / entry['n_test']:.2g} points per "
                        "image and reaches a target by luck")
            if field == "data":
                return f"it ran on {entry['data']} data and yours on {mine['data']} data: another task"
            if field == "hardware":
                return f"it ran on other hardware ({entry['hardware']}, yours {mine['hardware']})"
            return f"its target is {entry['target']:.0%}, yours {mine['target']:.0%}: another race"
    why = board.standing(entry)[1]
    return ("it was " + why if why.startswith("recorded") else why) or "it is on another board"


def _refused(exc: ValueError, what: str, mine: dict, refuse: bool) -> None:
    expect(refuse, f"with {what}: you refused to rank it ({exc}), but it can be ranked: it records its target, data, "
                   "number of test images, hardware and versions")
    missing = [k for k in (*board.COMPARABILITY_FIELDS, "versions") if mine.get(k) is None
               or (k == "versions" and not (mine.get("versions") or {}).get("torch"))]
    expect(any(m in str(exc) for m in missing),
           f"with {what}: refused, but the reason does not name what is missing ({', '.join(missing)}): {exc}")


def _judge_ranking(got, want: list[str], entries: list[dict], mine: dict, what: str) -> None:
    """The answer's names against the library's group (any order among ties; an attempt recorded twice may be
    listed once or twice)."""
    expect(isinstance(got, list) and all(isinstance(n, str) for n in got),
           f"with {what}: return the list of the names of the comparable attempts, best first, got "
           f"{type(got).__name__}")
    by_name = {e["name"]: e for e in entries}
    for name in got:
        expect(name in by_name, f"with {what}: {name!r} is not the name of an attempt of the leaderboard")
        expect(name in want, f"with {what}: you rank {name!r} with '{mine['name']}', but "
                             f"{_why_not(by_name[name], mine)}: it cannot be ranked with yours")
    for name in want:
        if name not in got:
            other = by_name[name]
            versions = ((other.get("versions") or {}).get("torch") != (mine.get("versions") or {}).get("torch"))
            raise CheckFailed(f"with {what}: {name!r} is missing from your ranking: it shares the target, the data, "
                              f"the number of test images and the hardware with '{mine['name']}'"
                              + (" (its torch version differs: versions are recorded to explain a gap, they do not "
                                 "split a group)" if versions else ""))
        expect(got.count(name) in (1, want.count(name)), f"with {what}: {name!r} appears {got.count(name)} times in "
                                                         f"your ranking, {want.count(name)} in the leaderboard")
    keys = [sort_key(by_name[n]) for n in got]
    expect(keys == sorted(keys), f"with {what}: expected the order {want}, got {got}: the attempts that reached the "
                                 "target first, by time to target (fastest first), then the others by test accuracy "
                                 "(highest first)")


@register("race", "fair_ranking", ("fair_ranking",), RACE_NB)
def _check_fair_ranking(fair_ranking: Callable) -> str:
    for case in BOARDS:
        entries, mine = case.kwargs["attempts"], case.kwargs["mine"]
        want = reference_ranking(entries, mine)
        given = copy.deepcopy(entries)
        try:
            got = fair_ranking(given, copy.deepcopy(mine))
        except ValueError as exc:
            _refused(exc, case.label, mine, want is None)
            continue
        except (CheckFailed, NotImplementedError):
            raise
        except Exception as exc:  # noqa: BLE001 - any error of the answer is reported in one line
            raise CheckFailed(f"with {case.label}: it raised {type(exc).__name__}: "
                              f"{(str(exc).splitlines() or [''])[0][:200]}") from None
        expect(given == entries, f"with {case.label}: the leaderboard passed in was modified: rank a new list")
        expect(want is not None, f"with {case.label}: '{mine['name']}' was recorded without "
                                 f"{board.standing(mine)[1].split(' (')[0].removeprefix('recorded without ')}: nothing "
                                 "says which attempts it can be compared with: refuse (raise ValueError saying what "
                                 "is missing)")
        _judge_ranking(got, want, entries, mine, case.label)
    return (f"ranked only with attempts of the same target, data, number of test images and hardware; a record that "
            f"does not say what it is comparable with is refused ({len(BOARDS)} leaderboards)")
