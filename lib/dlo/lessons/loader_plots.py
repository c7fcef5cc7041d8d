"""Charts of the DataLoader profiling lesson: per-iteration timeline and trials.
"""
from __future__ import annotations

import math
from pathlib import Path



from dlo.lessons.loader.advice import row_labels
from dlo.lessons.loader.trial import LoaderTrial
from dlo.measure.plots import _save as save


# --------------------------------------------------------------------------------------------------------
# Charts
# --------------------------------------------------------------------------------------------------------

_COLORS = {"wait": "tab:red", "copy": "tab:purple", "compute": "tab:blue"}


def _save(fig, path):

    return save(fig, path)


def plot_timeline(trials: LoaderTrial | list[LoaderTrial], labels: list[str] | None = None,
                  path: str | Path | None = None, *, max_iters: int | None = None):
    """A profiler-like timeline per trial (one row each, shared time axis): each iteration is a strip of
    ``wait`` (red: the loop is blocked on the loader), ``copy`` (purple: host to device) then ``compute``
    (blue). Iteration 0 (first batch, worker start-up) is hatched. A healthy loader shows solid blue with
    thin red slivers; an input-bound one shows red gaps between the blue blocks. Only the copy time *not*
    hidden under a compute is drawn (``copy_s - overlap_s``: all of it in a serial trial); the share hidden
    is written next to a trial that overlapped its copies.

    ``labels`` default to each trial's label; ``max_iters`` draws only the first iterations.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    if isinstance(trials, LoaderTrial):
        trials = [trials]
    trials = list(trials)
    if not trials:
        raise ValueError("plot_timeline needs at least one LoaderTrial")
    if labels is not None and len(labels) != len(trials):
        raise ValueError(f"got {len(labels)} labels for {len(trials)} trials")
    labels = labels or [t.label for t in trials]
    fig, axes = plt.subplots(len(trials), 1, figsize=(10, 0.9 * len(trials) + 1.3), sharex=True, squeeze=False)
    for ax, trial, name in zip(axes[:, 0], trials, labels):
        t = 0.0
        n = trial.n_iters if max_iters is None else min(max_iters, trial.n_iters)
        for i in range(n):
            exposed = max(0.0, trial.copy_s[i] - trial.overlap_s[i])
            for part, width in (("wait", trial.wait_s[i]), ("copy", exposed), ("compute", trial.compute_s[i])):
                if width > 0:
                    ax.barh(0, width, left=t, height=0.6, color=_COLORS[part], edgecolor="white", linewidth=0.3,
                            hatch="//" if i == 0 else None, alpha=0.6 if i == 0 else 1.0)
                t += width
        ax.set_yticks([0], [name])
        ax.set_ylim(-0.5, 0.5)
        hidden = f"\n  copy hidden {trial.copy_hidden:.0%}" if trial.mode == "overlap" else ""
        ax.text(1.0, 0.5, f"  {trial.throughput:,.0f} img/s\n  wait {trial.wait_fraction:.0%}{hidden}",
                transform=ax.transAxes, va="center", fontsize=8)
        ax.grid(axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel("time (s) from iter(loader)")
    handles = [Patch(color=c, label=k) for k, c in _COLORS.items()]
    handles.append(Patch(facecolor="white", edgecolor="grey", hatch="//", label="first batch"))
    fig.suptitle("DataLoader timeline: where each iteration's time goes")
    fig.tight_layout()
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=len(handles), fontsize=8,
               frameon=False)
    return _save(fig, path)


def plot_trials(df, path: str | Path | None = None, *, title: str = "DataLoader settings"):
    """All trials in one chart: throughput bars (img/s, left axis) and the share of time spent waiting for
    the loader (red dots, right axis), one per setting, labelled from the settings. ``df``: rows of
    :meth:`LoaderTrial.row`."""
    import matplotlib.pyplot as plt

    for col in ("throughput", "wait_fraction"):
        if col not in df.columns:
            raise ValueError(f"plot_trials needs a {col!r} column: build df from LoaderTrial.row()")
    names = row_labels(df)
    values = [float(v) for v in df["throughput"]]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(names) + 2), 4.2))
    x = range(len(names))
    bars = ax.bar(x, values, color=plt.cm.viridis([0.25 + 0.6 * i / max(1, len(names) - 1) for i in x]))
    for bar, v in zip(bars, values):
        ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height(), f"{v:,.0f}", ha="center", va="bottom",
                fontsize=8)
    ax.set_xticks(list(x), names, rotation=20, ha="right")
    ax.set_ylabel("throughput (img/s)")
    finite = [v for v in values if math.isfinite(v)]
    ax.set_ylim(0, (max(finite) if finite else 1) * 1.2)
    ax2 = ax.twinx()
    ax2.plot(list(x), [float(v) for v in df["wait_fraction"]], "o", color="tab:red", label="waiting for data")
    ax2.set_ylim(0, 1.05)
    ax2.set_ylabel("share of time waiting for the loader", color="tab:red")
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return _save(fig, path)
