"""What Jour2/ddp.ipynb reads from its launches of ``ddp_train.py``: step timings per run, the gradient buckets
each all-reduce moved (the communication hook's records), and their chart.

Each launch returns the ranks' records: ``{"kind": "timing", "run", "rank", "world_size", "global_batch",
"median_step_s", "step_times_s", "comm": [...]}`` per run and rank (``comm``: one entry per bucket and step,
with ``bucket``, ``params``, ``bytes``, ``start_s``, ``end_s``, ``comm_s``, ``step``).
"""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Sequence

import matplotlib.pyplot as plt
import pandas as pd

from dlo.measure import bench


def step_measurement(records: list[dict], label: str, run: str | None = None) -> bench.Measurement:
    """Rank 0's timed steps of one run as a Measurement (what the sentences comparing runs are written from)."""
    r = next(r for r in records if r["kind"] == "timing" and r["rank"] == 0 and (run is None or r["run"] == run))
    return bench.Measurement(name=label, times_s=r["step_times_s"], items_per_call=r["global_batch"])


def timing(records: list[dict], run: str | None = None) -> dict:
    """One run's row: processes, global batch, median over ranks of each rank's median step, images/s."""
    rows = [r for r in records if r["kind"] == "timing" and (run is None or r["run"] == run)]
    median = statistics.median(r["median_step_s"] for r in rows)
    return {"run": rows[0]["run"], "processes": rows[0]["world_size"], "global_batch": rows[0]["global_batch"],
            "median_step_ms": median * 1e3, "throughput": rows[0]["global_batch"] / median}


def bucket_records(records: list[dict]) -> pd.DataFrame:
    """Rank 0's bucket all-reduces of every run, step 0 left out (DDP rebuilds its buckets after it)."""
    comm = pd.DataFrame([dict(c, run=r["run"]) for r in records if r["kind"] == "timing" and r["rank"] == 0
                         for c in r.get("comm", [])])
    comm = comm[comm["step"] >= 1].copy()
    comm["MiB"] = comm["bytes"] / 2**20
    comm["comm_ms"] = comm["comm_s"] * 1e3
    return comm


def bucket_layout(comm: pd.DataFrame, run: str) -> pd.DataFrame:
    """One row per bucket of ``run``: parameters, MiB, median all-reduce time."""
    return (comm[comm["run"] == run].groupby("bucket")
            .agg(params=("params", "first"), MiB=("MiB", "first"), median_allreduce_ms=("comm_ms", "median")))


def bucket_table(comm: pd.DataFrame, records: list[dict], runs: Sequence[str]) -> pd.DataFrame:
    """Per run: buckets per step, MiB, summed all-reduce time, the communication window, and the step time."""
    per_step = comm.groupby(["run", "step"]).agg(buckets=("bucket", "count"), MiB=("MiB", "sum"),
                                                  comm_ms=("comm_ms", "sum"), span_ms=("end_s", "max"))
    per_step["span_ms"] *= 1e3
    table = per_step.groupby("run").median()
    steps = pd.DataFrame([timing(records, r) for r in runs]).set_index("run")[["median_step_ms", "throughput"]]
    return table.join(steps).loc[list(runs)]


def bucket_chart(comm: pd.DataFrame, runs: Sequence[str], path: str | Path | None = None) -> plt.Figure:
    """Each bucket's all-reduce during one backward (the last recorded step, rank 0), one panel per run."""
    fig, axes = plt.subplots(1, len(runs), figsize=(4.2 * len(runs), 3.2), sharey=True, squeeze=False)
    step = int(comm["step"].max())
    for ax, run in zip(axes[0], runs):
        one = comm[(comm["run"] == run) & (comm["step"] == step)]
        ax.barh(one["bucket"], (one["end_s"] - one["start_s"]) * 1e3, left=one["start_s"] * 1e3, color="tab:orange")
        for _, b in one.iterrows():
            ax.text(b["end_s"] * 1e3, b["bucket"], f" {b['MiB']:.2f} MiB", va="center", fontsize=8)
        ax.set_title(run, fontsize=9)
        ax.set_xlabel("ms since the first bucket was launched")
    axes[0][0].set_ylabel("bucket (0 = last layers)")
    fig.suptitle(f"all-reduce of each bucket during backward, step {step}, rank 0")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


__all__ = ["bucket_chart", "bucket_layout", "bucket_records", "bucket_table", "step_measurement", "timing"]
