"""The race's leaderboard: a JSON-lines file of attempts, a ranked table and a plot.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Iterable


from dlo.measure.bench import save_json
from dlo.runtime.paths import probe_writable
from dlo.runtime.paths import run_dir


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
    return entries


def append_to_leaderboard(record: dict[str, Any], path: str | os.PathLike) -> Path:
    """Append one attempt (a :func:`run_race` record) to the JSON list in ``path``."""
    path = check_writable(path)
    entries = read_leaderboard(path)
    entries.append(record)
    return save_json(entries, path)


LEADERBOARD_COLUMNS = ["name", "data", "target", "reached", "time_to_target_s", "epochs_to_target", "best_accuracy",
                       "compile_excluded", "compile_s", "time_to_target_with_compile_s", "load_s", "eval_s",
                       "device", "gpu", "date"]


def leaderboard(source: str | os.PathLike | Iterable[dict[str, Any]], *, target: float | None = None,
                data: str | None = None):
    """The attempts as a pandas table, fastest first: those that reached the target sorted by time to target,
    then the others by best accuracy. ``target`` / ``data`` ("generated" or "real CIFAR-10") keep only
    comparable attempts (a time to 60 % on generated data is no rival for a time to 94 % on CIFAR-10)."""
    import pandas as pd

    entries = read_leaderboard(source) if isinstance(source, (str, os.PathLike)) else list(source)
    if target is not None:
        target = check_target(target)
        entries = [e for e in entries if abs(e["target"] - target) < 1e-12]
    if data is not None:
        entries = [e for e in entries if e["data"] == data]
    rows = []
    for e in entries:
        row = {k: e.get(k) for k in LEADERBOARD_COLUMNS}
        row["gpu"] = (e.get("env") or {}).get("gpu")
        row["date"] = (e.get("env") or {}).get("date")
        rows.append(row)
    df = pd.DataFrame(rows, columns=LEADERBOARD_COLUMNS)
    if len(df):
        df["_miss"] = ~df["reached"].astype(bool)
        df["_t"] = df["time_to_target_s"].astype(float)
        df = df.sort_values(["_miss", "_t", "best_accuracy"], ascending=[True, True, False], na_position="last")
        df = df.drop(columns=["_miss", "_t"])
    df.index = pd.RangeIndex(1, len(df) + 1, name="rank")
    return df


def plot_race(records: Iterable[dict[str, Any]], target: float | None = None, path: str | os.PathLike | None = None,
              ax=None, title: str = "The race: test accuracy vs wall-clock time"):
    """Test accuracy vs time on the race clock, one line per attempt (one dot per epoch's evaluation); a star
    where it reached the target. The x axis starts at 0, when the clock starts: the gap before a curve's first
    dot is its data loading plus its first epoch."""
    import matplotlib.pyplot as plt

    records = list(records)
    if ax is None:
        fig, ax = plt.subplots(figsize=(7.5, 4.2))
    else:
        fig = ax.figure
    for r in records:
        times = [p["time_s"] for p in r["curve"]]  # measured points only (one per epoch)
        accs = [p["accuracy"] for p in r["curve"]]
        line, = ax.plot(times, accs, marker="o", ms=3, label=r["name"])
        if r.get("time_to_target_s") is not None:
            ax.plot([r["time_to_target_s"]], [r["curve"][r["epochs_to_target"] - 1]["accuracy"]], marker="*", ms=14,
                    color=line.get_color())
    if target is not None:
        ax.axhline(check_target(target), color="grey", ls="--", lw=1, label=f"target {target:.0%}")
    ax.set(xlabel="seconds on the race clock (data loading + training + evaluation)", ylabel="test accuracy",
           title=title)
    ax.set_xlim(left=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
    return fig



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
