"""The tables, plots and sentences of tp_tensor_parallel/tensor_parallel.ipynb, written from the records its launches
of ``tp_balises.py`` wrote (one record per rank and layout, or per rank for ``--sp``).

- :func:`first_run` : the first 2-process run (after balise 7): its differences with one process and its collectives;
- :func:`summary` : one row per (layout, implementation) of the training runs;
- :func:`comm_table` : the collectives of one step against :func:`dlo.parallel.tensor.comm_theory`;
- :func:`sp_memory` / :func:`sp_comm` : sequence parallelism's saved activations and collectives, against formulas;
- :func:`dtensor_measurements` : the from-scratch model's and DTensor's step times, for :func:`dlo.measure.conclude`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd

from dlo.measure.bench import Measurement
from dlo.parallel.tensor import comm_theory, sp_comm_sentence, sp_memory_sentence

Record = dict[str, Any]


def _comm_rows(comm: list[dict[str, Any]]) -> pd.DataFrame:
    rows = [{"op": c["op"], "phase": c["phase"], "calls": c["calls"], "MiB": c["bytes"] / 2**20} for c in comm]
    return pd.DataFrame(rows, columns=["op", "phase", "calls", "MiB"]).set_index(["op", "phase"])


def first_run(records: list[Record], layers: int) -> tuple[pd.DataFrame, str]:
    """The collectives of one step of rank 0, and a sentence: the loss and gradients against one process, and the
    all-reduces counted against ``2 L + 1`` per direction (2 per layer, the embedding's g, the LM head's f)."""
    r0 = min((r for r in records if r.get("kind") == "layout"), key=lambda r: r["rank"])
    worst = {k: max(r["compare"][k] for r in records if r.get("kind") == "layout") for k in ("loss", "grad")}
    comm = _comm_rows(r0["comm"])
    counted = {phase: sum(c["calls"] for c in r0["comm"] if c["op"] == "all_reduce" and c["phase"] == phase)
               for phase in ("forward", "backward")}
    sentence = (f"On {r0['tp']} processes: |loss − one process| = {worst['loss']:.1e}, largest gradient difference "
                f"{worst['grad']:.1e} (float32 rounding: the same model). All-reduces counted in one step: "
                f"{counted['forward']} forward and {counted['backward']} backward, for 2 · {layers} layers + 1 "
                f"= {2 * layers + 1} expected each way.")
    return comm, sentence


def summary(records: list[Record]) -> pd.DataFrame:
    """One row per (layout, implementation): time, memory and parameters per rank, differences with one process,
    collectives per step (the from-scratch ones only: DTensor's go through its own code, not our counter)."""
    rows = []
    for (layout, impl), rs in pd.DataFrame(records).groupby(["layout", "impl"], sort=False):
        r0 = rs.sort_values("rank").iloc[0]
        comm = pd.DataFrame(r0["comm"]) if r0["comm"] else pd.DataFrame(columns=["op", "phase", "calls", "bytes"])
        rows.append({
            "layout": layout, "impl": impl, "tp": r0["tp"], "dp": r0["dp"],
            "step ms (median, slowest rank)": 1e3 * rs["step_s_median"].max(),
            "tokens/s": r0["tokens_per_s"],
            "params per rank (M)": r0["local_params"] / 1e6,
            "peak memory per rank (MiB)": r0["peak_bytes"] / 2**20,
            "max |grad - 1 process|": max(c["grad"] for c in rs["compare"]) if r0["compare"] else None,
            "max |loss - 1 process|": max(c["loss"] for c in rs["compare"]) if r0["compare"] else None,
            "collectives / step": int(comm["calls"].sum()) if impl == "scratch" else None,
            "MiB sent / step": comm["bytes"].sum() / 2**20 if impl == "scratch" and len(comm) else None,
            "first loss": r0["losses"][0], "last loss": r0["losses"][-1], "val loss": r0["val_loss"],
        })
    return pd.DataFrame(rows).set_index(["layout", "impl"])


def comm_table(records: list[Record], layers: int) -> pd.DataFrame:
    """Rank 0's collectives of one step of every from-scratch layout with tp > 1, against ``comm_theory``
    (and the one DP all-reduce of the gradients where dp > 1)."""
    rows = []
    for r in records:
        if r["impl"] != "scratch" or r["rank"] != 0 or r["tp"] == 1:
            continue
        for (op, phase), calls in comm_theory(layers).items():
            got = next((c for c in r["comm"] if (c["op"], c["phase"]) == (op, phase)), {"calls": 0, "bytes": 0})
            rows.append({"layout": r["layout"], "op": op, "phase": phase, "theory calls": calls,
                         "measured calls": got["calls"], "measured MiB": got["bytes"] / 2**20})
        dp_row = next((c for c in r["comm"] if c["phase"] == "dp"), None)
        if dp_row:
            rows.append({"layout": r["layout"], "op": dp_row["op"], "phase": "dp (gradients)", "theory calls": 1,
                         "measured calls": dp_row["calls"], "measured MiB": dp_row["bytes"] / 2**20})
    return pd.DataFrame(rows)


def dtensor_measurements(records: list[Record], tokens_per_step: int,
                         warmup: int) -> dict[str, tuple[Measurement, Measurement]]:
    """Per pure-TP layout run both ways: the from-scratch model's and DTensor's timed steps (rank 0; the ranks wait
    for each other at every step) as two Measurements, for :func:`dlo.measure.conclude`."""
    firsts = {(r["layout"], r["impl"]): r for r in records if r["rank"] == 0}
    out = {}
    for (layout, impl), r in firsts.items():
        if impl != "scratch" or (layout, "dtensor") not in firsts:
            continue
        out[layout] = tuple(
            Measurement(name=f"{label} ({layout})", times_s=firsts[(layout, i)]["step_s"][warmup:],
                        items_per_call=tokens_per_step, unit="tokens/s", device=r["device"].split(":")[0],
                        warmup=warmup)
            for i, label in (("scratch", "from-scratch TP"), ("dtensor", "DTensor TP")))
    return out


def sp_memory(records: list[Record], path: Path | None = None) -> tuple[pd.DataFrame, plt.Figure, list[str]]:
    """Sequence parallelism (``--sp`` records): the bytes the RMSNorms keep per rank, TP and SP, measured against
    their formula, the differences with one process; a bar chart and one sentence per tp."""
    firsts = sorted((r for r in records if r["rank"] == 0), key=lambda r: r["tp"])
    rows = [{"tp": r["tp"], "version": v, "norm activations per rank (KiB, measured)": r[v]["norm_saved_bytes"] / 2**10,
             "formula (KiB)": r[v]["norm_saved_bytes_theory"] / 2**10, "max |grad - 1 process|": r[v]["grad_diff"],
             "|loss - 1 process|": r[v]["loss_diff"]} for r in firsts for v in ("TP", "SP")]
    table = pd.DataFrame(rows).set_index(["tp", "version"])
    if not (table["max |grad - 1 process|"] <= 1e-5).all():
        raise AssertionError("sequence parallelism differs from one process")
    if len({(r["tp"], r["SP"]["norm_saved_bytes"]) for r in records}) != len(firsts):
        raise AssertionError("the ranks of one TP group do not keep the same bytes")  # each holds as many tokens
    fig, ax = plt.subplots(figsize=(6, 3.2))
    width = 0.38
    for k, version in enumerate(("TP", "SP")):
        xs = [i + (k - 0.5) * width for i in range(len(firsts))]
        ax.bar(xs, [r[version]["norm_saved_bytes"] / 2**10 for r in firsts], width, label=f"{version} (measured)",
               color=("tab:blue", "tab:orange")[k])
        ax.scatter(xs, [r[version]["norm_saved_bytes_theory"] / 2**10 for r in firsts], color="black", marker="_",
                   s=400, zorder=3, label="formula" if k == 0 else None)
    ax.set_xticks(range(len(firsts)), [f"tp = {r['tp']}" for r in firsts])
    ax.set_ylabel("KiB per rank")
    ax.set_title("activations kept by the RMSNorms, one rank")
    ax.legend()
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    sentences = [sp_memory_sentence(r["tp"], r["TP"]["norm_saved_bytes"], r["SP"]["norm_saved_bytes"],
                                    r["SP"]["norm_saved_bytes_theory"]) for r in firsts]
    return table, fig, sentences


def sp_comm(records: list[Record], layers: int) -> tuple[pd.DataFrame, list[str]]:
    """The collectives of one step of TP and of SP (rank 0 of each tp) against SP's ``comm_theory``."""
    firsts = sorted((r for r in records if r["rank"] == 0), key=lambda r: r["tp"])
    theory = comm_theory(layers, sequence_parallel=True)
    rows = []
    for r in firsts:
        keys = sorted({(c["op"], c["phase"]) for v in ("TP", "SP") for c in r[v]["comm"]})
        for op, phase in keys:
            got = {v: next((c for c in r[v]["comm"] if (c["op"], c["phase"]) == (op, phase)),
                           {"calls": 0, "bytes": 0}) for v in ("TP", "SP")}
            rows.append({"tp": r["tp"], "op": op, "phase": phase, "TP calls": got["TP"]["calls"],
                         "TP MiB": got["TP"]["bytes"] / 2**20, "SP calls": got["SP"]["calls"],
                         "SP MiB": got["SP"]["bytes"] / 2**20, "SP theory calls": theory.get((op, phase), 0)})
    table = pd.DataFrame(rows).set_index(["tp", "op", "phase"])
    if not (table["SP calls"] == table["SP theory calls"]).all():
        raise AssertionError("SP's collectives differ from comm_theory")
    return table, [sp_comm_sentence(r["tp"], r["TP"]["comm"], r["SP"]["comm"]) for r in firsts]
