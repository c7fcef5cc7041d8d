"""Charts the lessons show. Each takes a pandas DataFrame of records (see ``dlo.measure.bench.table``) and
returns the matplotlib Figure (saved as PNG when ``path`` is given)."""
from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt


def _save(fig, path: str | Path | None):
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120, bbox_inches="tight")
    return fig


def ladder(df, *, value: str = "throughput", label: str = "name", unit: str = "img/s", baseline: str | None = None,
           title: str = "Optimisation ladder", path: str | Path | None = None):
    """Horizontal bars, one per step, labelled with the throughput and the speed-up over the baseline
    (the first row unless ``baseline`` names another)."""
    names = list(df[label])
    values = list(df[value])
    base = values[names.index(baseline)] if baseline else values[0]
    fig, ax = plt.subplots(figsize=(8, 0.55 * len(names) + 1.2))
    bars = ax.barh(range(len(names)), values, color=plt.cm.viridis([0.25 + 0.6 * i / max(1, len(names) - 1)
                                                                   for i in range(len(names))]))
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlabel(unit)
    ax.set_title(title)
    for bar, v in zip(bars, values):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f"  {v:,.{0 if v >= 100 else 1}f} {unit}  (x{v / base:.2f})",
                va="center", fontsize=9)
    ax.set_xlim(0, max(values) * 1.35)
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
