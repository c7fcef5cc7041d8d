"""The short launches of Jour2/dp_scratch.ipynb, right after a step passes: a few timed steps of the versions
written so far against DDP on 2 processes, the sentences comparing them (the decision rule of
:func:`dlo.measure.conclude`) and one recorded step of each as a Gantt chart of backward and all-reduces."""
from __future__ import annotations

from typing import Sequence

import statistics

import matplotlib.pyplot as plt
import pandas as pd

from dlo.measure import conclude
from dlo.parallel import comm_gantt, exposed_comm_s

DDP = "DDP (25 MiB default)"


def quick_look(records: list[dict], results: dict, versions: Sequence[str],
               pairs: Sequence[tuple[str, str]]) -> tuple[pd.DataFrame, list[str], plt.Figure]:
    """Step times of ``versions`` (and compute only, DDP) from one launch, a sentence per ``(a, b)`` of ``pairs``
    (a compared with b, recorded in ``results``), and the Gantt chart of each version's recorded step."""
    timings = {r["name"]: r for r in records if r["kind"] == "timing"}
    names = ["compute only", *versions, DDP]
    table = pd.DataFrame([{"version": v, "median_ms": timings[v]["median_s"] * 1e3,
                           "images/s": timings[v]["throughput"]} for v in names]).set_index("version")
    sentences = [conclude(results, timings[a], timings[b], a_label=a, b_label=b) for a, b in pairs]
    shown = [v for v in [*versions, DDP] if any(r["kind"] == "events" and r["version"] == v for r in records)]
    ranks = max(r["rank"] for r in records) + 1
    fig, axes = plt.subplots(len(shown), 1, figsize=(11, (0.9 * ranks + 1.2) * len(shown)), sharex=True,
                             squeeze=False)
    for ax, version in zip(axes[:, 0], shown):
        events = sorted((r for r in records if r["kind"] == "events" and r["version"] == version),
                        key=lambda r: r["rank"])
        comm_gantt([r["events"] for r in events], title=f"{version}, {ranks} processes", ax=ax)
    fig.tight_layout()
    return table, sentences, fig


def _quartiles(values: Sequence[float]) -> list[float]:
    return statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else [values[0]] * 3


def exposed_comm(runs: dict[int, list[dict]], versions: Sequence[str]) -> tuple[pd.DataFrame, plt.Figure]:
    """Per world size and version: step time minus the compute-only step, round by round (median and quartiles),
    and the communication left after backward in the recorded events (none for DDP, which waits inside
    backward); with its bar chart."""
    rows = []
    for n, records in runs.items():
        t = {r["name"]: r for r in records if r["kind"] == "timing"}
        events: dict[str, list[float]] = {}
        for r in records:
            if r["kind"] == "events":
                events.setdefault(r["version"], []).append(exposed_comm_s(r["events"]))
        for name in versions:
            paired = [a - b for a, b in zip(t[name]["times_s"], t["compute only"]["times_s"])]
            q25, med, q75 = _quartiles(paired)
            after = None if name == DDP else statistics.median(events[name]) * 1e3
            rows.append({"processes": n, "version": name, "exposed_ms": med * 1e3, "q25_ms": q25 * 1e3,
                         "q75_ms": q75 * 1e3, "after_backward_ms (events)": after})
    exposed = pd.DataFrame(rows)
    fig, axes = plt.subplots(1, len(runs), figsize=(5 * len(runs), 3.2), squeeze=False)
    for ax, (n, part) in zip(axes[0], exposed.groupby("processes")):
        ax.bar(part["version"], part["exposed_ms"], color=["tab:red", "tab:orange", "tab:green", "tab:blue"],
               yerr=[part["exposed_ms"] - part["q25_ms"], part["q75_ms"] - part["exposed_ms"]], capsize=4)
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_title(f"{n} processes", fontsize=10)
        ax.set_ylabel("step − compute-only step (ms)")
        ax.tick_params(axis="x", labelrotation=20, labelsize=8)
    fig.suptitle("exposed communication per step (median, bars: interquartile range)")
    fig.tight_layout()
    return exposed, fig


def bucket_sweep(timings: dict[int, dict[str, dict]], bucket_mb: Sequence[float]) -> tuple[pd.DataFrame, plt.Figure]:
    """Step time against the bucket size, hand-written buckets and DDP's ``bucket_cap_mb``, per world size."""
    rows = []
    for n, t in timings.items():
        for mb in bucket_mb:
            for kind, name in (("buckets", f"buckets {mb:g} MiB"),
                               ("DDP", DDP if mb == 25 else f"DDP bucket_cap_mb={mb:g}")):
                r = t[name]
                rows.append({"processes": n, "kind": kind, "bucket_MiB": mb, "median_ms": r["median_s"] * 1e3,
                             "q25_ms": r["q25_s"] * 1e3, "q75_ms": r["q75_s"] * 1e3})
    sweep = pd.DataFrame(rows)
    fig, axes = plt.subplots(1, len(timings), figsize=(5 * len(timings), 3.4), squeeze=False)
    for ax, (n, part) in zip(axes[0], sweep.groupby("processes")):
        for kind, line in part.groupby("kind"):
            ax.plot(line["bucket_MiB"], line["median_ms"], marker="o", label=kind)
            ax.fill_between(line["bucket_MiB"], line["q25_ms"], line["q75_ms"], alpha=0.2)
        ax.axvline(25, color="grey", linestyle="--", linewidth=1)
        ax.text(25, ax.get_ylim()[1], " DDP default: 25 MiB\n (reference)", fontsize=7, va="top")
        ax.axhline(timings[n]["compute only"]["median_s"] * 1e3, color="black", linewidth=0.8, label="compute only")
        ax.set_xscale("log")
        ax.set_xlabel("bucket size (MiB)")
        ax.set_ylabel("step time (ms, median and IQR)")
        ax.set_title(f"{n} processes", fontsize=10)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return sweep, fig


__all__ = ["DDP", "bucket_sweep", "exposed_comm", "quick_look"]
