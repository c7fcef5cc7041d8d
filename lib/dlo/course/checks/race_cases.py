"""Generated cases of the race checkers (:mod:`dlo.course.checks.race`), compared with the library's own
implementation: :func:`dlo.lessons.race.time_to_target` and :func:`dlo.lessons.leaderboard.leaderboard`.

``time_to_target``: curves of 0 to 8 evaluations at uneven intervals, with a target crossed between two
evaluations, reached exactly, reached at the first evaluation, missed by less than a thousandth, never reached,
and curves that dip under the target after reaching it or rise above it again. ``fair_ranking``: leaderboards of
3 to 12 attempts on three devices, three targets, two kinds of data and several test-set sizes, with records that
lack a comparability field or their torch version, the same attempt twice, ties in time and in accuracy, and the
new attempt in the list or not. Cases come from :func:`dlo.course.checks.cases.seeded` (fixed edge cases first,
then seeded draws, smallest first). Values are compared (names, order, times; nothing is differentiated: no
gradient applies here).
"""
from __future__ import annotations

import copy
import random

from dlo.course.checks.cases import Case, seeded
from dlo.lessons import leaderboard as board
from dlo.lessons import race

# --------------------------------------------------------------------------------------------------
# time_to_target
# --------------------------------------------------------------------------------------------------


def _curve_case(times, accs, target, size) -> Case:
    return Case(f"times={list(times)}, accuracies={list(accs)}, target={target}",
                {"times": list(times), "accuracies": list(accs), "target": target}, size)


#: first reach, exact equality, a curve that goes down again, never, empty, one evaluation exactly at the target
FIXED_CURVES = [
    _curve_case([1.0, 2.0, 3.0], [0.2, 0.7, 0.9], 0.5, 0),
    _curve_case([1.0, 2.0, 3.0], [0.2, 0.5, 0.9], 0.5, 0),
    _curve_case([0.5, 1.5, 2.5, 3.5], [0.3, 0.96, 0.91, 0.97], 0.94, 0),
    _curve_case([1.0, 2.0], [0.1, 0.4], 0.5, 0),
    _curve_case([], [], 0.5, 0),
    _curve_case([4.0], [1.0], 1.0, 0),
]


def _draw_curve(rng: random.Random) -> Case:
    n = rng.randint(1, 8)
    times, t = [], 0.0
    for _ in range(n):  # uneven intervals between evaluations
        t = round(t + rng.uniform(0.2, 6.0), 3)
        times.append(t)
    accs = [round(rng.uniform(0.05, 0.99), 4) for _ in range(n)]
    kind = rng.choice(["between", "exact", "first", "near miss", "never"])
    if kind == "exact":
        target = accs[rng.randrange(n)]
    elif kind == "first":
        target = round(max(accs[0] - rng.uniform(0.0, 0.05), 0.01), 4)
    elif kind == "near miss":
        target = round(min(max(accs) + 0.0005, 1.0), 4)
    elif kind == "never":
        target = round(min(max(accs) + rng.uniform(0.01, 0.2), 1.0), 4)
    else:  # strictly between two accuracies of the curve
        lo, hi = sorted(rng.sample(accs, 2)) if n > 1 else (accs[0] - 0.1, accs[0])
        target = round(max((lo + hi) / 2, 0.01), 4)
    return _curve_case(times, accs, target, 1 + n)


CURVES = seeded(_draw_curve, 24, seed=5, fixed=FIXED_CURVES)


def reference_time_to_target(times, accuracies, target):
    return race.time_to_target(times, accuracies, target)


# --------------------------------------------------------------------------------------------------
# fair_ranking
# --------------------------------------------------------------------------------------------------

H100, A100, CPU = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB", "CPU: AMD EPYC 7763, 8 cores"


def rec(name: str, time_s: float | None, *, n_test: int = 10000, data: str = "real CIFAR-10", hardware: str = H100,
        target: float = 0.94, best: float | None = None, torch_version: str | None = "2.6.0") -> dict:
    record = {"name": name, "rule": race.RACE_RULE, "target": target, "reached": time_s is not None,
              "time_to_target_s": time_s,
              "accuracy": best if best is not None else (target + 0.004 if time_s is not None else target - 0.02),
              "n_test": n_test, "data": data, "hardware": hardware, "epochs": 9, "epochs_run": 9}
    if torch_version is not None:
        record["versions"] = {"torch": torch_version, "cuda": "12.4"}
    return record


def _without(record: dict, field: str) -> dict:
    return {k: v for k, v in record.items() if k != field}


def _fixed_boards() -> list[Case]:
    """The hand-written leaderboards: an official attempt, a practice one, one recorded without its hardware."""
    mine = rec("mine", 8.2)
    official = [
        rec("lucky 20 images", 3.1, n_test=20),  # beats everyone on 20 images: 5 points per image
        rec("generated data", 1.4, data="generated"),
        rec("faster GPU", 4.0, hardware=A100),
        rec("same setup, slower", 9.7),
        mine,
        rec("other target", 2.0, target=0.90),
        rec("same setup, not reached", None, best=0.931),
        rec("old record", 5.5, torch_version=None),  # no versions: recorded before the fields existed
        rec("same setup, faster", 6.6),
        rec("same setup, newer torch", 7.9, torch_version="2.7.0"),
        rec("same setup, not reached, closer", None, best=0.938),
        rec("half the test set", 6.0, n_test=5000),
        _without(rec("no hardware", 4.4), "hardware"),
    ]
    cpu_mine = rec("my CPU practice", 41.0, n_test=500, data="generated", hardware=CPU, target=0.5)
    practice = [
        rec("CPU practice, 20 images", 12.0, n_test=20, data="generated", hardware=CPU, target=0.5),
        rec("CPU practice, faster", 30.5, n_test=500, data="generated", hardware=CPU, target=0.5),
        rec("GPU practice", 2.0, n_test=500, data="generated", hardware=H100, target=0.5),
        cpu_mine,
        rec("CPU, real data", 35.0, n_test=500, hardware=CPU, target=0.5),
    ]
    unknown = _without(rec("mine, old file", 7.0), "hardware")
    return [Case("an official attempt", {"attempts": official, "mine": mine}, 0),
            Case("a practice attempt", {"attempts": practice, "mine": cpu_mine}, 0),
            Case("an attempt recorded without its hardware", {"attempts": official + [unknown], "mine": unknown}, 0)]


_SETUPS = [dict(data="real CIFAR-10", n_test=10000), dict(data="real CIFAR-10", n_test=5000),
           dict(data="generated", n_test=500), dict(data="generated", n_test=2000), dict(data="real CIFAR-10", n_test=20000)]
_DIFFERENCES = ["same", "same", "same", "hardware", "target", "data", "n_test", "missing field", "no torch version",
                "versions without torch", "newer torch"]


def _attempt(rng: random.Random, i: int, mine: dict) -> dict:
    """Attempt ``i``: mine's setup, changed in one way (or not); times and accuracies on a coarse grid (ties)."""
    reached = rng.random() < 0.6
    time_s = rng.choice([3.0, 4.5, 6.0, 7.5, 9.0]) if reached else None
    best = round(mine["target"] + (0.004 if reached else -rng.choice([0.01, 0.02, 0.03])), 4)
    a = rec(f"#{i}", time_s, n_test=mine["n_test"], data=mine["data"], hardware=mine["hardware"],
            target=mine["target"], best=best)
    how = rng.choice(_DIFFERENCES)
    if how == "hardware":
        a["hardware"] = rng.choice([h for h in (H100, A100, CPU) if h != mine["hardware"]])
    elif how == "target":
        a["target"] = rng.choice([t for t in (0.5, 0.93, 0.94, 0.96) if t != mine["target"]])
    elif how == "data":
        a["data"] = "generated" if mine["data"] != "generated" else "real CIFAR-10"
    elif how == "n_test":
        a["n_test"] = rng.choice([n for n in (20, 500, 5000, 10000, 20000) if n != mine["n_test"]])
    elif how == "missing field":
        a = _without(a, rng.choice(board.COMPARABILITY_FIELDS))
    elif how == "no torch version":
        a = _without(a, "versions")
    elif how == "versions without torch":
        a["versions"] = {"cuda": "12.4"}
    elif how == "newer torch":
        a["versions"] = {"torch": "2.7.0", "cuda": "12.4"}
    return a


def _draw_board(rng: random.Random) -> Case:
    setup = rng.choice(_SETUPS)
    mine = rec("mine", rng.choice([4.5, 6.0, 8.2]), hardware=rng.choice([H100, A100, CPU]),
               target=rng.choice([0.5, 0.93, 0.94]), **setup)
    attempts = [_attempt(rng, i, mine) for i in range(rng.randint(3, 11))]
    if attempts and rng.random() < 0.5:  # the same attempt appended twice
        attempts.append(copy.deepcopy(rng.choice(attempts)))
    if rng.random() < 0.6:
        attempts.insert(rng.randrange(len(attempts) + 1), mine)
    rng.shuffle(attempts)
    label = (f"a leaderboard of {len(attempts)} attempts, yours on {mine['hardware']}, {mine['data']} data, "
             f"{mine['n_test']} test images, target {mine['target']:.0%}")
    return Case(label, {"attempts": attempts, "mine": mine}, 1 + len(attempts))


def _draw_refused(rng: random.Random) -> Case:
    mine = rec("mine, old file", 7.0)
    field = rng.choice([*board.COMPARABILITY_FIELDS, "versions"])
    mine = _without(mine, field) if field != "versions" or rng.random() < 0.5 else dict(mine, versions={"cuda": "12.4"})
    attempts = [rec("#0", 6.0), rec("#1", None), mine]
    return Case(f"an attempt recorded without its {field}", {"attempts": attempts, "mine": mine}, 2)


BOARDS = [*seeded(_draw_board, 18, seed=9, fixed=_fixed_boards()), *seeded(_draw_refused, 3, seed=2)]
BOARDS.sort(key=lambda c: c.size)


def reference_ranking(attempts: list[dict], mine: dict) -> list[str] | None:
    """The names the library ranks with ``mine`` (best first), or None when it cannot say (mine is unofficial)."""
    if board.standing(mine)[0] == "unofficial":
        return None
    table = board.leaderboard(attempts)
    return list(table[table["group"] == board.group_title(mine)]["name"])


def sort_key(entry: dict) -> tuple:
    """What the ranking orders by: reached first, by time to target; then by test accuracy, highest first."""
    return (0, entry["time_to_target_s"]) if entry["reached"] else (1, -entry["accuracy"])
