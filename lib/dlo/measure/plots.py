"""Charts the lessons show. Each takes a pandas DataFrame of records (see ``dlo.measure.table``) and
returns the matplotlib Figure (saved as PNG when ``path`` is given)."""
from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt

from dlo.measure.verdicts import format_ratio
from dlo.measure.records import table


def _save(fig, path: str | Path | None):
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120, bbox_inches="tight")
    return fig


def ladder(df, *, value: str = "throughput", label: str = "name", unit: str = "img/s", baseline: str | None = None,
           low: str | None = "throughput_low", high: str | None = "throughput_high", decision: str | None = "decision",
           ratio: str | None = "speedup_text", retry: str | None = "retry_of", versus: str = "baseline",
           title: str = "Optimisation ladder",
           path: str | Path | None = None):
    """Horizontal bars, one per step, with the noise band as an error bar (columns ``low``..``high``: the
    throughput at the slow and fast quartiles of the repeats), labelled with the throughput, the speed-up
    over the baseline and the ladder's decision ("kept", "not faster beyond noise", ...).

    The speed-up is the text of column ``ratio`` when the table has one (a :class:`dlo.measure.verdicts.Ladder`
    table: it says so when the baseline is not steady), else computed over the first row (or the row
    named ``baseline``) and written with 2 significant digits; ``versus`` names what it is relative to. Rows with a value in column ``retry`` (steps
    re-tried at the batch the sweep chose, :meth:`dlo.measure.verdicts.Ladder.retry`) are hatched. Columns named
    but absent are skipped."""
    names = list(df[label])
    values = [float(v) for v in df[value]]
    base = values[names.index(baseline)] if baseline else values[0]
    ratios = list(df[ratio]) if ratio and ratio in df else [format_ratio(v / base) for v in values]
    decisions = list(df[decision]) if decision and decision in df else [""] * len(names)
    fig, ax = plt.subplots(figsize=(9, 0.6 * len(names) + 1.2))
    bars = ax.barh(range(len(names)), values, color=plt.cm.viridis([0.25 + 0.6 * i / max(1, len(names) - 1)
                                                                   for i in range(len(names))]))
    retried = ([isinstance(v, str) and bool(v) for v in df[retry]] if retry and retry in df
               else [False] * len(names))
    for bar, again in zip(bars, retried):
        if again:
            bar.set_hatch("//")
            bar.set_edgecolor("white")
    if any(retried):
        from matplotlib.patches import Patch

        ax.add_artist(ax.legend(handles=[Patch(facecolor="lightgrey", hatch="//", edgecolor="white",
                                               label="re-tried at the batch the sweep chose")],
                                loc="upper right", fontsize=8))
    right = list(values)
    if low and high and low in df and high in df:
        lows, highs = [float(v) for v in df[low]], [float(v) for v in df[high]]
        ax.errorbar(values, range(len(names)), xerr=[[max(0.0, v - lo) for v, lo in zip(values, lows)],
                                                     [max(0.0, hi - v) for v, hi in zip(values, highs)]],
                    fmt="none", ecolor="black", elinewidth=1.2, capsize=4, label="noise band (interquartile range)")
        right = [max(v, hi) for v, hi in zip(values, highs)]
        ax.legend(loc="lower right", fontsize=8)
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlabel(unit)
    ax.set_title(title)
    for bar, v, r, d, x in zip(bars, values, ratios, decisions, right):
        against = r if str(r).startswith("no ratio") else f"{r} vs {versus}"
        text = f"  {v:,.{0 if v >= 100 else 1}f} {unit}  ({against})" + (f"  {d}" if d else "")
        ax.text(x, bar.get_y() + bar.get_height() / 2, text, va="center", fontsize=9)
    ax.set_xlim(0, max(right) * 1.7)
    ax.grid(axis="x", alpha=0.3)
    return _save(fig, path)


def batch_sweep(df, *, batch: str = "batch_size", value: str = "throughput", memory: str = "peak_memory_bytes",
                unit: str = "img/s", memory_label: str = "peak memory (MiB)", title: str = "Batch-size sweep",
                path: str | Path | None = None):
    """Throughput (left axis) and peak memory (right axis) against the batch size."""
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(df[batch], df[value], "o-", color="tab:blue", label=unit)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size")
    ax.set_ylabel(unit, color="tab:blue")
    ax.set_xticks(list(df[batch]), [str(b) for b in df[batch]])
    ax2 = ax.twinx()
    ax2.plot(df[batch], df[memory] / 2**20, "s--", color="tab:red", label=memory_label)
    ax2.set_ylabel(memory_label, color="tab:red")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def curves(df, *, x: str = "step", ys: tuple[str, ...] = ("loss",), title: str = "Training", path: str | Path | None = None):
    """Line plot of one or more columns against ``x`` (one panel per column)."""
    fig, axes = plt.subplots(1, len(ys), figsize=(5 * len(ys), 3.5), squeeze=False)
    for ax, y in zip(axes[0], ys):
        sub = df.dropna(subset=[y])
        ax.plot(sub[x], sub[y], "o-", markersize=3)
        ax.set_xlabel(x)
        ax.set_ylabel(y)
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, path)
