"""Checkers of the CIFAR-10 race notebook (course ``race``, Jour4/cifar_race.ipynb)."""
from __future__ import annotations

from typing import Callable

from dlo.course.checks.framework import expect, register
from dlo.lessons import race
from dlo.lessons import leaderboard as board

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
    return "the first evaluation that shows the target gives the time; None if none does"


#: training images the my_recipe check holds out and evaluates on (the smoke task trains on the others)
_CHECK_VAL = 256


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

_H100, _A100, _CPU = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB", "CPU: AMD EPYC 7763, 8 cores"


def _rec(name: str, time_s: float | None, *, n_test: int = 10000, data: str = "real CIFAR-10", hardware: str = _H100,
         target: float = 0.94, best: float | None = None, torch_version: str | None = "2.6.0") -> dict:
    record = {"name": name, "rule": race.RACE_RULE, "target": target, "reached": time_s is not None,
              "time_to_target_s": time_s,
              "accuracy": best if best is not None else (target + 0.004 if time_s is not None else target - 0.02),
              "n_test": n_test, "data": data, "hardware": hardware, "epochs": 9, "epochs_run": 9}
    if torch_version is not None:
        record["versions"] = {"torch": torch_version, "cuda": "12.4"}
    return record


def _fair_cases() -> list[tuple[str, list[dict], dict]]:
    """(what the case is about, the leaderboard, the attempt whose group is ranked); shuffled orders on purpose."""
    mine = _rec("mine", 8.2)
    official = [
        _rec("lucky 20 images", 3.1, n_test=20),  # beats everyone on 20 images: 5 points per image
        _rec("generated data", 1.4, data="generated"),
        _rec("faster GPU", 4.0, hardware=_A100),
        _rec("same setup, slower", 9.7),
        mine,
        _rec("other target", 2.0, target=0.90),
        _rec("same setup, not reached", None, best=0.931),
        _rec("old record", 5.5, torch_version=None),  # no versions: recorded before the fields existed
        _rec("same setup, faster", 6.6),
        _rec("same setup, newer torch", 7.9, torch_version="2.7.0"),
        _rec("same setup, not reached, closer", None, best=0.938),
        _rec("half the test set", 6.0, n_test=5000),
        {k: v for k, v in _rec("no hardware", 4.4).items() if k != "hardware"},
    ]
    cpu_mine = _rec("my CPU practice", 41.0, n_test=500, data="generated", hardware=_CPU, target=0.5)
    practice = [
        _rec("CPU practice, 20 images", 12.0, n_test=20, data="generated", hardware=_CPU, target=0.5),
        _rec("CPU practice, faster", 30.5, n_test=500, data="generated", hardware=_CPU, target=0.5),
        _rec("GPU practice", 2.0, n_test=500, data="generated", hardware=_H100, target=0.5),
        cpu_mine,
        _rec("CPU, real data", 35.0, n_test=500, hardware=_CPU, target=0.5),
    ]
    unknown = {k: v for k, v in _rec("mine, old file", 7.0).items() if k != "hardware"}
    return [("an official attempt", official, mine), ("a practice attempt", practice, cpu_mine),
            ("an attempt recorded without its hardware", official + [unknown], unknown)]


def _why_not(entry: dict, mine: dict) -> str:
    """Why ``entry`` cannot be ranked with ``mine``, in words."""
    for field, what in (("n_test", "test images"), ("data", "data"), ("hardware", "hardware"), ("target", "target")):
        if entry.get(field) is None:
            return f"it was recorded without its {field} (nothing says what it can be compared with)"
        if entry[field] != mine[field]:
            if field == "n_test":
                return (f"it was evaluated on {entry['n_test']:,} test images and yours on {mine['n_test']:,}: an "
                        f"accuracy on {entry['n_test']:,} images moves by {100 / entry['n_test']:.2g} points per "
                        "image and reaches a target by luck")
            if field == "data":
                return f"it ran on {entry['data']} data and yours on {mine['data']} data: another task"
            if field == "hardware":
                return f"it ran on other hardware ({entry['hardware']}, yours {mine['hardware']})"
            return f"its target is {entry['target']:.0%}, yours {mine['target']:.0%}: another race"
    return board.standing(entry)[1] or "it is on another board"


@register("race", "fair_ranking", ("fair_ranking",), RACE_NB)
def _check_fair_ranking(fair_ranking: Callable) -> str:
    import copy

    for what, entries, mine in _fair_cases():
        given = copy.deepcopy(entries)
        refuse = board.standing(mine)[0] == "unofficial"
        try:
            got = fair_ranking(given, copy.deepcopy(mine))
        except ValueError as exc:
            expect(refuse, f"{what}: you refused to rank it ({exc}), but it can be ranked: it records its target, "
                           "data, number of test images, hardware and versions")
            missing = [k for k in (*board.COMPARABILITY_FIELDS, "versions") if mine.get(k) is None]
            expect(any(m in str(exc) for m in missing),
                   f"{what}: refused, but the reason does not name what is missing ({', '.join(missing)}): {exc}")
            continue
        expect(given == entries, f"{what}: the leaderboard passed in was modified: rank a new list")
        expect(not refuse, f"{what}: '{mine['name']}' was recorded without its hardware: nothing says which attempts "
                           "it can be compared with: refuse (raise ValueError saying what is missing)")
        expect(isinstance(got, list) and all(isinstance(n, str) for n in got),
               f"{what}: return the list of the names of the comparable attempts, best first, got {type(got).__name__}")
        table = board.leaderboard(entries)
        want = list(table[table["group"] == board.group_title(mine)]["name"])
        by_name = {e["name"]: e for e in entries}
        for name in got:
            expect(name in by_name, f"{what}: {name!r} is not the name of an attempt of the leaderboard")
            expect(name in want, f"{what}: you rank {name!r} with '{mine['name']}', but "
                                 f"{_why_not(by_name[name], mine)}: it cannot be ranked with yours")
        for name in want:
            if name not in got:
                other = by_name[name]
                versions = ((other.get("versions") or {}).get("torch") != (mine.get("versions") or {}).get("torch"))
                expect(False, f"{what}: {name!r} is missing from your ranking: it shares the target, the data, the "
                              f"number of test images and the hardware with '{mine['name']}'"
                              + (" (its torch version differs: versions are recorded to explain a gap, they do not "
                                 "split a group)" if versions else ""))
        expect(len(got) == len(set(got)), f"{what}: an attempt appears twice in your ranking")
        expect(got == want, f"{what}: expected the order {want}, got {got}: the attempts that reached the target "
                            "first, by time to target (fastest first), then the others by test accuracy (highest first)")
    return ("ranked only with attempts of the same target, data, number of test images and hardware; a record that "
            "does not say what it is comparable with is refused")
