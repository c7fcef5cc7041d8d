"""The race's leaderboard: a JSON file of attempts, tables that rank only comparable attempts, and a plot.

A time to target depends on more than the recipe: on the hardware, on the data (real CIFAR-10 or generated
images), and on how many test images decide that the target is reached (an accuracy on 20 images moves by
5 points per image and reaches a target by luck; on 10 000 images, by 0.01 point). So every attempt records
its ``n_test``, its ``data`` kind, its ``hardware`` (the GPU's name, or the CPU's) and its ``versions``
(torch, ...), and the tables rank an attempt only against attempts that share the target, the data kind, the
number of test images and the hardware (:func:`comparability_key`). The **official** board takes only attempts
on the whole 10 000-image real CIFAR-10 test set; the others are **practice** boards, one per comparability
key; attempts recorded before these fields existed, or under another rule than :data:`RACE_RULE` (an older
harness stopped at the first epoch whose *test* accuracy reached the target), still load, as **unofficial**,
with one line saying why.
"""
from __future__ import annotations

import json
import math
import os
import platform
from pathlib import Path
from typing import Any, Iterable, Mapping


from dlo.lessons.race_recipe import RACE_RULE
from dlo.measure.records import save_json
from dlo.runtime.paths import probe_writable
from dlo.runtime.paths import run_dir
from dlo.measure.records import environment_info


# --------------------------------------------------------------------------------------------------
# Leaderboard and plot
# --------------------------------------------------------------------------------------------------

def leaderboard_path(name: str = "cifar_race", out_dir: str | os.PathLike | None = None) -> Path:
    """``runs/<name>/leaderboard.json`` (or ``<out_dir>/leaderboard.json``)."""

    return run_dir(name, out_dir) / "leaderboard.json"


def read_leaderboard(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The attempts stored in ``path`` (an empty list when the file does not exist yet)."""
    path = Path(path)
    if not path.exists():
        return []
    try:
        entries = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"leaderboard {path} is not valid JSON ({exc.msg}, line {exc.lineno}): fix or delete it") from None
    if not isinstance(entries, list):
        raise ValueError(f"leaderboard {path} must hold a JSON list of attempts: fix or delete it")
    return valid_entries(entries, str(path))


#: Fields of an attempt that must be finite numbers when present (a leaderboard sorts and compares them).
_NUMBERS = ("target", "n_test", "time_to_target_s", "time_after_loading_s", "accuracy", "best_accuracy", "epochs",
            "epochs_run", "compile_s", "time_to_target_with_compile_s", "load_s", "eval_s")


def _problem(entry: Any) -> str | None:
    if not isinstance(entry, dict):
        return f"a JSON {type(entry).__name__}, not an attempt"
    for key in _NUMBERS:
        value = entry.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return f"field {key} is {value!r}, not a finite number"
    for key in ("env", "versions"):
        if entry.get(key) is not None and not isinstance(entry[key], dict):
            return f"field {key} is {entry[key]!r}, not an object"
    return None


def valid_entries(entries: Iterable[Any], where: str = "the leaderboard") -> list[dict[str, Any]]:
    """The attempts of ``entries`` that a table can rank: an attempt of the wrong shape (not an object, a number
    field that is a string, NaN or inf) is left out with one warning naming ``where``, its index and the field;
    every other attempt is kept."""
    import warnings

    kept = []
    for i, entry in enumerate(entries):
        problem = _problem(entry)
        if problem:
            warnings.warn(f"{where}: attempt {i}: {problem}: left out, the other attempts are ranked", stacklevel=2)
        else:
            kept.append(entry)
    return kept


def append_to_leaderboard(record: dict[str, Any], path: str | os.PathLike) -> Path:
    """Append one attempt (a :func:`run_race` record) to the JSON list in ``path``."""
    path = check_writable(path)
    entries = read_leaderboard(path)
    entries.append(record)
    return save_json(entries, path)


LEADERBOARD_COLUMNS = ["board", "group", "name", "data", "n_test", "hardware", "target", "reached", "time_to_target_s",
                       "tied", "time_after_loading_s", "accuracy", "epochs", "epochs_run", "compile_excluded", "compile_s",
                       "time_to_target_with_compile_s", "load_s", "eval_s", "device", "gpu", "torch", "date", "why"]

#: Two times to target closer than this (relative) are a tie: single attempts of the same recipe on one machine
#: vary by several percent (loading, clocks, other jobs), so a smaller gap says nothing about the recipes. Where a
#: group holds repeated attempts of one recipe, their own spread widens it (:func:`tie_resolution`).
MIN_TIE_RESOLUTION = 0.05

#: The official board: the whole real CIFAR-10 test set, nothing less.
OFFICIAL_DATA = "real CIFAR-10"
OFFICIAL_N_TEST = 10000
#: What two attempts must share to be ranked together (the target, the data kind, the number of test images
#: and the hardware); an attempt recorded without one of them (an older leaderboard file) is "unofficial".
COMPARABILITY_FIELDS = ("target", "data", "n_test", "hardware")
BOARDS = ("official", "practice", "unofficial")


def _cpu_model() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def hardware_name(env: Mapping[str, Any]) -> str:
    """The hardware an attempt ran on, as the leaderboard groups it: the GPU's name (``env["gpu"]``, from
    :func:`dlo.measure.environment_info`), else the CPU's model and the cores the process could use."""
    if env.get("gpu"):
        return str(env["gpu"])
    return f"CPU: {env.get('cpu_model') or _cpu_model()}, {env.get('cpu_cores', '?')} cores"


def attempt_fields(env: Mapping[str, Any]) -> dict[str, Any]:
    """What :func:`dlo.lessons.race.run_race` adds to every record so attempts can be compared: ``hardware``
    (:func:`hardware_name`) and ``versions`` (torch, torchvision, dlo, CUDA, cuDNN, Python)."""
    return {"hardware": hardware_name(env),
            "versions": {k: env.get(k) for k in ("torch", "torchvision", "dlo", "cuda", "cudnn", "python")}}


def _missing(entry: Mapping[str, Any]) -> list[str]:
    missing = [k for k in COMPARABILITY_FIELDS if entry.get(k) is None]
    if not (entry.get("versions") or {}).get("torch"):
        missing.append("versions")
    return missing


def standing(entry: Mapping[str, Any]) -> tuple[str, str]:
    """``(board, why)`` of one attempt: ``("official", "")`` for the whole 10 000-image real CIFAR-10 test set,
    ``("practice", why)`` for an attempt on generated data or on part of the test set (ranked only against
    attempts with the same data kind, test-set size, hardware and target), ``("unofficial", why)`` for an
    attempt recorded without those fields (an older leaderboard file): nothing says what it can be compared with."""
    missing = _missing(entry)
    if missing:
        return "unofficial", (f"recorded without {', '.join(missing)} (an older leaderboard file): not comparable "
                              f"with other attempts")
    if entry.get("rule") != RACE_RULE:
        return "unofficial", ("recorded under another rule than a fixed number of epochs and one test evaluation (an "
                              "older harness stopped at the first epoch whose test accuracy reached the target: a "
                              "choice made on the test set)")
    if entry["data"] != OFFICIAL_DATA:
        return "practice", f"{entry['data']} data, not real CIFAR-10"
    if entry["n_test"] != OFFICIAL_N_TEST:
        return "practice", (f"evaluated on {entry['n_test']} test images, not the whole {OFFICIAL_N_TEST:,}: an accuracy "
                            f"on fewer images is noisier and reaches a target by luck more often")
    return "official", ""


def comparability_key(entry: Mapping[str, Any]) -> tuple:
    """``(board, target, data, n_test, hardware)``: attempts with the same key are ranked together, never others."""
    return (standing(entry)[0], *(entry.get(k) for k in COMPARABILITY_FIELDS))


def group_title(entry: Mapping[str, Any]) -> str:
    """The readable title of an attempt's group of comparable attempts (its :func:`comparability_key`)."""
    return _group_title(comparability_key(entry))


def _group_title(key: tuple) -> str:
    board, target, data, n_test, hardware = key
    target_s = f"target {target:.0%}" if isinstance(target, (int, float)) else "target ?"
    n_s = f"{n_test:,} test images" if isinstance(n_test, int) else "test images: ?"
    return f"{board} · {data or 'data ?'}, {n_s} · {hardware or 'hardware ?'} · {target_s}"


def leaderboard(source: str | os.PathLike | Iterable[dict[str, Any]], *, target: float | None = None,
                data: str | None = None, board: str | None = None):
    """The attempts as a pandas table, ranked **only among comparable attempts**.

    Each attempt has a ``board`` (:func:`standing`): "official" (real CIFAR-10, the whole 10 000-image test
    set), "practice" (generated data, or part of the test set) or "unofficial" (an older record without the
    fields that say what it is comparable with; ``why`` says so in one line). Attempts are grouped by
    :func:`comparability_key` (board, target, data kind, number of test images, hardware; ``group`` is its
    readable title); official groups come first, then practice, then unofficial. Within a group, the attempts
    that reached the target come first, by time to target, then the others by test accuracy; the index is the
    ``rank`` within the group, shared by attempts whose times to target differ by less than the noise
    (:func:`tie_resolution`; ``tied`` marks them): a win by 0.06 s in a 4 s race is not a win. ``accuracy`` is the attempt's one test evaluation (an older record's best
    accuracy over its epochs). ``target`` / ``data`` ("generated" or "real CIFAR-10") / ``board`` keep only
    those attempts.
    """
    import pandas as pd

    entries = (read_leaderboard(source) if isinstance(source, (str, os.PathLike))
               else valid_entries(source, "the attempts given"))
    if target is not None:
        target = check_target(target)
        entries = [e for e in entries if e.get("target") is not None and abs(e["target"] - target) < 1e-12]
    if data is not None:
        entries = [e for e in entries if e.get("data") == data]
    if board is not None:
        if board not in BOARDS:
            raise ValueError(f"board must be one of {', '.join(BOARDS)}, got {board!r}")
        entries = [e for e in entries if standing(e)[0] == board]
    rows = []
    for e in entries:
        env = e.get("env") or {}
        key = comparability_key(e)
        row = {k: e.get(k) for k in LEADERBOARD_COLUMNS}
        if row["accuracy"] is None:
            row["accuracy"] = e.get("best_accuracy")
        row.update(board=key[0], group=_group_title(key), why=standing(e)[1], gpu=env.get("gpu"),
                   date=env.get("date"), torch=(e.get("versions") or {}).get("torch") or env.get("torch"))
        row["_board"] = BOARDS.index(key[0])
        rows.append(row)
    df = pd.DataFrame(rows, columns=LEADERBOARD_COLUMNS + ["_board"])
    if len(df):
        df["_miss"] = ~df["reached"].astype(bool)
        df["_t"] = df["time_to_target_s"].astype(float)
        df = df.sort_values(["_board", "group", "_miss", "_t", "accuracy"],
                            ascending=[True, True, True, True, False], na_position="last", kind="stable")
        rank, tied = [0] * len(df), [False] * len(df)
        for title, positions in df.groupby("group", sort=False).indices.items():
            group = [e for e in entries if _group_title(comparability_key(e)) == title]
            times = [None if df["_miss"].iat[i] else float(df["_t"].iat[i]) for i in positions]
            ranks, ties = _tie_ranks(times, tie_resolution(group))
            for i, r, t in zip(positions, ranks, ties):
                rank[i], tied[i] = r, t
        df["rank"], df["tied"] = rank, tied
        df = df.drop(columns=["_miss", "_t", "_board"]).set_index("rank")
    else:
        df = df.drop(columns=["_board"])
        df.index = pd.RangeIndex(1, 1, name="rank")
    return df


def tie_resolution(entries: Iterable[Mapping[str, Any]]) -> float:
    """The relative gap below which two times to target are a tie: :data:`MIN_TIE_RESOLUTION`, or the widest
    relative spread ((max - min) / min) of the repeated attempts of one recipe among ``entries`` (attempts with the
    same ``recipe`` settings but their seed and name), whichever is larger."""
    by_recipe: dict[str, list[float]] = {}
    for e in entries:
        recipe = e.get("recipe")
        if not isinstance(recipe, Mapping) or not e.get("reached") or e.get("time_to_target_s") is None:
            continue
        key = json.dumps({k: v for k, v in recipe.items() if k not in ("seed", "name")}, sort_keys=True, default=str)
        by_recipe.setdefault(key, []).append(float(e["time_to_target_s"]))
    spreads = [(max(t) - min(t)) / min(t) for t in by_recipe.values() if len(t) > 1 and min(t) > 0]
    return max([MIN_TIE_RESOLUTION, *spreads])


def _tie_ranks(times: list[float | None], resolution: float) -> tuple[list[int], list[bool]]:
    """Ranks for attempts sorted best first (``None``: did not reach the target, ranked after, by accuracy):
    an attempt within ``resolution`` (relative) of the first attempt of the current tie shares its rank."""
    ranks, tied = [], []
    first_t, first_rank = None, 0
    for i, t in enumerate(times):
        if t is not None and first_t is not None and t <= first_t * (1 + resolution) * (1 + 1e-9):
            ranks.append(first_rank)
            tied.append(True)
            tied[first_rank - 1] = True
            continue
        first_t, first_rank = t, i + 1
        ranks.append(i + 1)
        tied.append(False)
    return ranks, tied


def boards(source: str | os.PathLike | Iterable[dict[str, Any]], **filters: Any) -> dict[str, Any]:
    """:func:`leaderboard` cut into one table per group of comparable attempts, ``{group title: table}``,
    official groups first."""
    table = leaderboard(source, **filters)
    return {group: part.drop(columns=["group"]) for group, part in table.groupby("group", sort=False)}


def plot_race(records: Iterable[dict[str, Any]], target: float | None = None, path: str | os.PathLike | None = None,
              title: str = "The race: test accuracy and time"):
    """Two panels. Left: each attempt as one point, its one test evaluation against its total time on the
    race clock (a star when it reached the target, a dot when not), with the target line. Right: each
    attempt's training loss at the end of each epoch against the race clock: where its time went (the gap
    before the first point is loading and, when counted, compilation; the step from the last point to the
    left panel's point is the test evaluation). No test accuracy during training: the race does not read it."""
    import matplotlib.pyplot as plt

    records = list(records)
    fig, (ax, ax_loss) = plt.subplots(1, 2, figsize=(11, 4.2))
    for r in records:
        acc = r.get("accuracy", r.get("best_accuracy"))
        reached = r.get("time_to_target_s") is not None
        pts, = ax.plot([r["total_s"]], [acc], marker="*" if reached else "o", ms=14 if reached else 7, ls="none",
                       label=r["name"])
        curve = [p for p in r.get("curve", []) if p.get("train_loss") is not None and math.isfinite(p["train_loss"])]
        ax_loss.plot([p["time_s"] for p in curve], [p["train_loss"] for p in curve], marker="o", ms=3,
                     color=pts.get_color(), label=r["name"])
    if target is not None:
        ax.axhline(check_target(target), color="grey", ls="--", lw=1, label=f"target {target:.0%}")
    ax.set(xlabel="seconds on the race clock (loading + training + the test evaluation)",
           ylabel="test accuracy (one evaluation)", title=title)
    ax_loss.set(xlabel="seconds on the race clock", ylabel="training loss (epoch mean)",
                title="where the time went: one point per epoch")
    return _finish(fig, (ax, ax_loss), path)


def _finish(fig, axes, path):
    """Time axes from 0, a light grid, the legend on the first axes; saved to ``path`` when given."""
    for a in axes:
        a.set_xlim(left=0)
        a.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
    return fig


def plot_validation(record: dict[str, Any], path: str | os.PathLike | None = None):
    """A :func:`dlo.lessons.race.validation_run`'s accuracy on the held-out images after each epoch, against
    its clock, with the target line and the first epoch that reached it."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    curve = record["curve"]
    ax.plot([p["time_s"] for p in curve], [p["accuracy"] for p in curve], marker="o", ms=4, label=record["name"])
    ax.axhline(record["target"], color="grey", ls="--", lw=1, label=f"target {record['target']:.0%}")
    if record.get("val_time_to_target_s") is not None:
        first = record["val_epochs_to_target"]
        ax.plot([record["val_time_to_target_s"]], [curve[first - 1]["accuracy"]], marker="*", ms=14,
                color="tab:green", ls="none", label=f"first reached: epoch {first}")
    ax.set(xlabel="seconds (training + a validation evaluation per epoch)",
           ylabel=f"accuracy on {record['n_val']} held-out training images",
           title="Choosing the epochs on a validation split (the test set is not read)")
    return _finish(fig, (ax,), path)


# --------------------------------------------------------------------------------------------------
# Checks and the time-to-target rule
# --------------------------------------------------------------------------------------------------

def check_target(target: Any) -> float:
    """A target accuracy is a fraction in (0, 1]; anything else is a one-line ValueError."""
    ok = isinstance(target, (int, float)) and not isinstance(target, bool) and math.isfinite(target)
    if not ok or not 0 < target <= 1:
        hint = " (a fraction, not a percentage: 0.94 for 94 %)" if ok and 1 < target <= 100 else ""
        raise ValueError(f"target accuracy must be in (0, 1]{hint}, got {target!r}")
    return float(target)



def check_writable(path: str | os.PathLike) -> Path:
    """Make sure ``path`` (a file) can be written, before spending minutes on a race; one-line error if not."""
    path = Path(path)
    if path.exists() and path.is_dir():
        raise IsADirectoryError(f"leaderboard path {path} is a folder: give a file name, e.g. {path / 'leaderboard.json'}")
    try:
        probe_writable(path.parent)
        if path.exists() and not os.access(path, os.W_OK):
            raise PermissionError("read-only file")
    except OSError as exc:
        raise PermissionError(f"leaderboard path {path} is not writable ({exc.strerror or exc}): pass another "
                              f"out_dir / --leaderboard, or set DLO_RUNS_DIR to a writable folder") from None
    return path
