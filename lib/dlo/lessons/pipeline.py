"""What tp_pipeline/pipeline.ipynb and grid.ipynb do around the schedules the student writes, kept out of sight.

* :func:`try_schedule`: one schedule launched at once in a small configuration (after its check), its measured
  Gantt chart under the target one (:func:`dlo.lessons.figures.pipeline.target_and_measured`), and one sentence
  written from the run: the measured bubble against the target's;
* :func:`naive_idle`, :func:`zero_bubble_table`: the tables of the closing run and of the zero-bubble reading;
* :func:`implementation_comparison`: our 1F1B against ``torch.distributed.pipelining`` and DeepSpeed, each
  pair of timed steps handed to :func:`dlo.measure.conclude` by the notebook (recorded with its numbers);
* :func:`layout_tables`: grid.ipynb's per-rank and per-layout tables (memory, time, communication against theory);
* :func:`reference_figures`: the labelled figures from real multi-GPU runs, read from files (``results/``, the
  ``dlo gpu-check`` files, and a section of REFERENCES.md), never typed into a notebook.
"""
from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import pandas as pd

from dlo.lessons.figures.pipeline import target_and_measured, target_timeline
from dlo.measure.bench import Measurement
from dlo.parallel.pipeline import analysis as sim
from dlo.parallel.grid_step import by_axis, comm_theory
from dlo.parallel.pipeline import bubble_fraction
from dlo.runtime.grid import Grid
from dlo.runtime.paths import ROOT


def try_schedule(launch_fn: Callable[..., list[dict]], schedule: str, *, script: str | Path, args: Sequence[str],
                 stages: int, micro_batches: int, env: Mapping[str, str] | None = None, timeout_s: float = 600,
                 course: str = "pipeline") -> tuple[Any, str, dict]:
    """Launch ``script`` with only ``schedule`` on ``stages`` processes (``launch_fn``: the notebook's
    ``launch_checked``, which refuses at once a step that does not pass its check) and return the figure (target
    above, measured below), the sentence that compares their bubbles, and the run's record."""
    m = 1 if schedule == "naive" else micro_batches
    records = launch_fn(course, script, [*map(str, args), "--schedules", schedule, "--micro-batches", str(m)],
                        nproc=stages, steps=[schedule], env=env, timeout_s=timeout_s, records_dir=None)
    ran = [r for r in records if r.get("schedule") == schedule and not r.get("skipped")]
    if not ran:
        why = "; ".join(r["skipped"] for r in records if r.get("skipped")) or "no record came back"
        raise ValueError(f"{schedule} on {stages} stages with m={m} did not run: {why}")
    rec = ran[-1]
    fig = target_and_measured(schedule, stages, m, rec["events"], bubble=rec["bubble"])
    return fig, bubble_sentence(schedule, stages, m, rec["bubble"]), rec


def bubble_sentence(schedule: str, stages: int, micro_batches: int, measured: float) -> str:
    """The measured bubble against the target's, in words (which side, by how much), from the two numbers."""
    target = float(sim.bubble_fraction(target_timeline(schedule, stages, micro_batches))["bubble"])
    side = "above" if measured > target else "below" if measured < target else "equal to"
    gap = abs(measured - target)
    why = ("the stages also wait for transfers, for Python's bookkeeping between computes and, on a CPU with fewer "
           "cores than processes, for a core" if measured > target else
           "a measured bubble below the target means unequal stages or a backward cheaper than two forwards here")
    return (f"**{schedule}, p = {stages}, m = {micro_batches}:** the target's bubble is {target:.0%} of the step; "
            f"this run measured {measured:.0%}, {side} it by {gap:.0%} of the step"
            + (f" ({why})." if side != "equal to" else "."))


def naive_idle(runs: pd.DataFrame, nprocs: Sequence[int]) -> pd.DataFrame:
    """Per pipeline size and rank: busy and idle time of the naive schedule's step, from its event logs."""
    rows = []
    for n in nprocs:
        r = runs[(runs.stages == n) & (runs.schedule == "naive")].iloc[-1]
        b = bubble_fraction([{"events": e} for e in r.events])
        for rank, (busy, idle) in enumerate(zip(b["busy_s"], b["idle_s"])):
            rows.append({"stages": n, "rank": rank, "busy (ms)": busy * 1e3, "idle (ms)": idle * 1e3,
                         "idle fraction": idle / b["span_s"], "theory (p-1)/p": (n - 1) / n})
    return pd.DataFrame(rows)


def _run(runs: pd.DataFrame, n: int, name: str, m: int) -> pd.Series | None:
    sel = runs[(runs.stages == n) & (runs.schedule == name) & (runs.micro_batches == m)]
    return None if sel.empty else sel.iloc[-1]


def implementation_comparison(runs: pd.DataFrame, nprocs: Sequence[int], *, device: str,
                              tokens_per_step: int) -> tuple[pd.DataFrame, list[tuple[Measurement, Measurement, dict]]]:
    """Ours against the libraries, at the micro-batch count torch_gpipe ran with: one row per implementation
    (step time with its spread, first and last loss, memory), and the pairs to compare, our 1F1B against
    ``torch_1f1b`` and ``deepspeed``: ``(ours, theirs, labels)`` for :func:`dlo.measure.conclude`."""
    rows, pairs = [], []
    for n in nprocs:
        gpipe = runs[(runs.stages == n) & (runs.schedule == "torch_gpipe")]
        if gpipe.empty:
            continue
        m = int(gpipe.iloc[-1].micro_batches)
        for name in ("afab", "torch_gpipe", "1f1b", "torch_1f1b", "deepspeed"):
            r = _run(runs, n, name, m)
            if r is None:
                continue  # skipped by the launch, with its reason printed there (e.g. DeepSpeed not installed)
            times = list(r.step_times_s) if isinstance(r.get("step_times_s"), list) else []
            acts = r.peak_activation_bytes
            rows.append({"stages": n, "schedule": name, "micro_batches": m, "step (ms)": r.step_s * 1e3,
                         "step spread (ms)": (max(times) - min(times)) * 1e3 if len(times) > 1 else None,
                         "timed steps": len(times), "loss": r.loss, "final_loss": r.final_loss,
                         "max activations (MiB)": None if acts is None else max(acts) / 2**20,
                         "peak GPU memory (MiB)": max(r.peak_memory_bytes) / 2**20 if device == "cuda" else None})
        ours = _run(runs, n, "1f1b", m)
        for other in ("torch_1f1b", "deepspeed"):
            theirs = _run(runs, n, other, m)
            if ours is None or theirs is None:
                continue
            a, b = (Measurement(name=f"{x.schedule} (p={n}, m={m})", times_s=list(x.step_times_s),
                                items_per_call=tokens_per_step, unit="tokens/s", device=device) for x in (ours, theirs))
            pairs.append((a, b, {"a_label": f"Our 1F1B (p={n}, m={m})", "b_label": f"{other} (p={n}, m={m})"}))
    return pd.DataFrame(rows), pairs


def zero_bubble_table(p: int, m_read: int) -> tuple[pd.DataFrame, str]:
    """Simulated bubbles of AFAB, 1F1B, interleaved (v=2) and ZB-H1 for m = p, 2p, 4p and ``m_read`` (F = B = W = 1)
    against their closed forms, and the sentence comparing ZB-H1 with 1F1B at ``m_read``. Raises if a simulated
    bubble differs from its closed form."""
    rows = []
    for m in sorted({p, 2 * p, 4 * p, m_read}):
        cases = [("afab", 1, Fraction(p - 1, m + p - 1), "(p-1)/(m+p-1)"),
                 ("1f1b", 1, Fraction(p - 1, m + p - 1), "(p-1)/(m+p-1)"),
                 ("interleaved", 2, Fraction(p - 1, 2 * m + p - 1), "(p-1)/(v·m+p-1), v=2"),
                 ("zb-h1", 1, sim.zb_h1_bubble_theory(p, m), "(p-1)/(3m+p-1)")]
        for name, v, closed, formula in cases:
            tl = sim.simulate_schedule(name, p, m, v)
            b = sim.bubble_fraction(tl)
            rows.append({"schedule": name, "p": p, "m": m, "simulated bubble": float(b["bubble"]),
                         "closed form": float(closed), "formula": formula, "exact match": b["bubble"] == closed,
                         "idle per rank (units)": float(b["idle_s"][0]),
                         "held until B": sim.peak_in_flight(tl, until="B"),
                         "held until W": sim.peak_in_flight(tl, until="W")})
    table = pd.DataFrame(rows)
    if not table["exact match"].all():
        raise AssertionError("a simulated bubble differs from its closed form")
    row = {r["schedule"]: r for r in rows if r["m"] == m_read}
    one, zb = row["1f1b"], row["zb-h1"]
    sentence = (
        f"With F = B = W, p = {p} and m = {m_read}, each rank idles {zb['idle per rank (units)']:g} units in ZB-H1 "
        f"against {one['idle per rank (units)']:g} in 1F1B ({zb['idle per rank (units)'] / one['idle per rank (units)']:.2f} "
        f"of it): the bubble falls from {one['simulated bubble']:.1%} to {zb['simulated bubble']:.1%}. Micro-batches held "
        f"until B, per rank: {zb['held until B']} (1F1B: {one['held until B']}); until W: {zb['held until W']}, "
        f"at most {max(zb['held until W'])} as 1F1B's rank 0 ({max(one['held until B'])}).")
    return table, sentence


def _references_section(title: str, path: Path) -> str | None:
    if not path.is_file():
        return None
    lines, inside = [], False
    for line in path.read_text().splitlines():
        if line.startswith("## "):
            inside = line[3:].strip() == title
            continue
        if inside and line.strip():
            lines.append(line)
    return "\n".join(lines) or None


def _recorded_runs(benchmark: str, results_dir: Path) -> list[str]:
    """One line per non-dry ``dlo gpu-check`` row of ``benchmark`` found in ``results_dir``, with its GPU."""
    out = []
    for f in sorted(results_dir.glob("gpu-check-*.json")):
        try:
            data = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if data.get("dry_run"):
            continue
        env = data.get("environment") or {}
        gpu = env.get("gpu") or env.get("device_name") or env.get("device") or "GPU"
        for row in data.get("results", []):
            if row.get("benchmark") == benchmark and row.get("value") is not None:
                details = ", ".join(f"{k} {v}" for k, v in (row.get("details") or {}).items()
                                    if isinstance(v, (int, float, str)))
                out.append(f"- `{f.name}` ({data.get('gpus', '?')} × {gpu}): {row['what']}: **{row['value']:.3g}** "
                           f"(target {row.get('target')}; {row.get('verdict')}); {details}")
    return out


def reference_figures(benchmark: str, section: str, *, root: Path = ROOT) -> str:
    """Markdown: the recorded multi-GPU runs of ``benchmark`` in ``results/`` (``dlo gpu-check`` files), or a line
    saying there is none yet, then the REFERENCES.md ``section``, labelled as published references."""
    runs = _recorded_runs(benchmark, root / "results")
    head = "**Reference figures (not measured by this notebook).**\n\n"
    if runs:
        head += "Recorded multi-GPU runs of this workbook (`results/`):\n" + "\n".join(runs) + "\n\n"
    else:
        head += (f"No multi-GPU run of this benchmark (`{benchmark}`) is recorded in `results/` yet: on a GPU node, "
                 f"`python -m dlo gpu-check --only {benchmark}` writes one.\n\n")
    ref = _references_section(section, root / "REFERENCES.md")
    if ref:
        head += f"From REFERENCES.md, *{section}* (published, with their sources):\n\n{ref}\n"
    return head


def layout_tables(records: Mapping[str, list[dict]], cfg: Any, nproc: int, *, batch: int, seq: int,
                  micro_batches: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """grid.ipynb's tables, from each layout's records (one per rank): per rank, its coordinates, pipeline peers,
    parameter and saved-activation bytes, and its communication per axis measured against ``comm_theory``; per
    layout, the step time, tokens/s and the largest rank's memory and communication."""
    rank_rows, layout_rows = [], []
    for name, rs in records.items():
        grid = Grid(nproc, dp=rs[0]["dp"], pp=rs[0]["pp"], tp=rs[0]["tp"])
        mine = []
        for r in rs:
            measured = {(c["op"], c["phase"]): {"calls": c["calls"], "bytes": c["bytes"]} for c in r["comm"]}
            theory = by_axis(comm_theory(cfg, grid, r["rank"], batch=batch, seq=seq, micro_batches=micro_batches))
            row = {"layout": name, "rank": r["rank"],
                   "dp, pp, tp": (r["coords"]["dp"], r["coords"]["pp"], r["coords"]["tp"]),
                   "layers": r["layers"][0], "pp peers": r["pp_peers"], "param KiB": r["param_bytes"] / 2**10,
                   "param KiB (theory)": r["param_bytes_theory"] / 2**10,
                   "saved act. KiB": r["peak_saved_bytes"] / 2**10}
            for axis, v in by_axis(measured).items():
                row[f"{axis} calls"] = v["calls"]
                row[f"{axis} KiB"] = v["bytes"] / 2**10
                row[f"{axis} KiB (theory)"] = theory[axis]["bytes"] / 2**10
            row["= theory"] = r["comm_matches_theory"]
            mine.append(row)
        rank_rows += mine
        layout_rows.append({"layout": name, "step (ms)": rs[0]["step_s"] * 1e3,
                            "tokens/s": rs[0]["tokens_per_step"] / rs[0]["step_s"],
                            "param KiB per rank (max)": max(x["param KiB"] for x in mine),
                            "saved act. KiB per rank (max)": max(x["saved act. KiB"] for x in mine),
                            **{f"{a} KiB per rank (max)": max(x.get(f"{a} KiB", 0) for x in mine)
                               for a in ("tp", "pp", "dp")},
                            "comm = theory on every rank": all(x["= theory"] for x in mine)})
    return pd.DataFrame(rank_rows), pd.DataFrame(layout_rows)
