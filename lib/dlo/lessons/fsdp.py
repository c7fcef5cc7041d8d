"""What tp_fsdp/fsdp.ipynb measures around the script the student writes (tp_fsdp/fsdp_train.py).

* the memory wall, predicted: :func:`memory_wall` (calculator, every strategy, 1 to 8 GPUs) and
  :func:`wall_answer`, the answer to the notebook's first question, written from the table;
* one step, launched as soon as it is written: :func:`run_step` (its checks first, one small configuration, its
  step timed until steady) and :func:`step_report` (peak memory per rank, the calculator's prediction, the step
  time against the run before, through ``dlo.measure.conclude``);
* activation checkpointing, predicted: :func:`activation_shrink`;
* the closing launch: :func:`closing_runs` (every configuration, the batch sweep, the prefetch runs),
  :func:`summary`, :func:`prefetch_table` and :func:`prefetch_plot`.

The levers of a fast step and the recorded GPU run are in :mod:`dlo.lessons.fsdp_levers`.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Sequence

import matplotlib.pyplot as plt
import pandas as pd

from dlo.measure import conclude, memory
from dlo.parallel import fsdp as ref

#: The exercise steps each core run needs written (the launch is refused, in one line, until they pass).
STEPS_NEEDED = {"ddp": ["ddp"], "fsdp": ["fsdp"], "precision": ["fsdp", "precision"],
                "checkpointing": ["fsdp", "precision", "checkpointing"]}


def memory_wall(cfg: memory.TransformerConfig, gpu_gb: float, *, gpus: Sequence[int] = (1, 2, 4, 8), batch: int = 1,
                seq_len: int = 2048, path: str | Path | None = None) -> tuple[pd.DataFrame, plt.Figure]:
    """The calculator's GB per GPU for DDP, ZeRO-1, ZeRO-2 and FSDP on 1 to 8 GPUs (AdamW, bf16 mixed precision,
    ``batch`` x ``seq_len`` tokens per GPU), and its plot against one GPU's ``gpu_gb``."""
    rows = []
    for strategy in ("ddp", "zero1", "zero2", "fsdp"):
        for n in gpus:
            m = memory.per_gpu_memory(cfg, n, strategy=strategy, precision="bf16_mixed", batch=batch, seq_len=seq_len)
            rows.append({"strategy": strategy, "gpus": n, "model_states_GB": m["model_states"] / memory.GB,
                         "activations_GB": m["activations"] / memory.GB, "total_GB": m["total"] / memory.GB,
                         f"fits_{gpu_gb}GB": m["total"] <= gpu_gb * memory.GB})
    wall = pd.DataFrame(rows)
    fig, ax = plt.subplots(figsize=(7, 3.2))
    for strategy, grp in wall.groupby("strategy", sort=False):
        ax.plot(grp["gpus"], grp["total_GB"], marker="o", label=strategy)
    ax.axhline(gpu_gb, color="k", ls="--", lw=1, label=f"{gpu_gb} GB GPU")
    ax.set(xscale="log", xticks=list(gpus), xticklabels=list(gpus), xlabel="GPUs", ylabel="GB per GPU",
           title=f"{cfg.name}, AdamW bf16 mixed, {batch} x {seq_len} tokens per GPU (calculator)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return wall, fig


def wall_answer(wall: pd.DataFrame, gpu_gb: float) -> str:
    """The answer to "will DDP fit, on one GPU and per rank on more?", from the calculator's table."""
    ddp = wall[wall["strategy"] == "ddp"].set_index("gpus")["total_GB"]
    fsdp = wall[wall["strategy"] == "fsdp"].set_index("gpus")["total_GB"]
    most = int(ddp.index.max())
    fits = [int(n) for n in fsdp.index if fsdp[n] <= gpu_gb]
    verdict = "fits" if ddp[1] <= gpu_gb else "does not fit"
    return (f"**Answer (calculator).** DDP needs {ddp[1]:.1f} GB on one GPU: it {verdict} in {gpu_gb} GB; on "
            f"{most} GPUs it still needs {ddp[most]:.1f} GB per rank, since every rank holds everything. FSDP "
            f"needs {fsdp[most]:.1f} GB per rank on {most} GPUs"
            + (f" and fits from {min(fits)} GPU(s)." if fits else f" and does not fit on up to {most} GPUs."))


def activation_shrink(cfg: memory.TransformerConfig, *, batch: int, seq_len: int) -> dict[str, float]:
    """The calculator's activations of one rank's step without and with activation checkpointing (GB) and their
    ratio: what checkpointing is predicted to save for ``cfg`` at ``batch`` x ``seq_len`` tokens."""
    kw = dict(strategy="fsdp", precision="bf16_mixed", batch=batch, seq_len=seq_len)
    full = memory.per_gpu_memory(cfg, 1, checkpointing=False, **kw)["activations"]
    ckpt = memory.per_gpu_memory(cfg, 1, checkpointing=True, **kw)["activations"]
    return {"activations_GB": full / memory.GB, "checkpointed_GB": ckpt / memory.GB, "ratio": full / ckpt}


def core_run(name: str, options: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    """One core step's run: ``options`` at the core's small size, its step then timed until steady."""
    return {"name": name, "steps": settings["core_steps"], "warmup_steps": settings["core_warmup"],
            "timed_repeats": settings["core_repeats"], "warmup_max_calls": settings["prefetch_warmup_max"], **options}


def run_step(name: str, options: dict[str, Any], step: str, *, launcher: Callable[..., list[dict[str, Any]]],
             script: Path, common: list[str], settings: dict[str, Any],
             env: dict[str, str] | None) -> list[dict[str, Any]]:
    """Launch one core configuration on ``settings["nproc"]`` processes with ``launcher`` (the course's
    ``launch_checked``: the exercise ``step`` and the steps it builds on must pass their checks first); returns
    the ranks' records."""
    run = core_run(name, options, settings)
    args = common + ["--global-batch", str(settings["global_batch"]), "--runs", json.dumps([run])]
    return launcher("fsdp", script, args, nproc=settings["nproc"], steps=STEPS_NEEDED[step],
                    timeout_s=settings["timeout_s"], env=env)


def _mb(records: list[dict[str, Any]]) -> str:
    r0 = records[0]
    if r0["status"] != "ok":
        return f"**{r0['run']}**: {r0['status']} (predicted {r0['predicted_gb'] * 1e3:,.0f} MB per rank)"
    peak = max(r["peak_memory_gb"] for r in records) * 1e3
    return (f"**{r0['run']}**: peak {peak:,.0f} MB per rank ({r0['memory_kind']}), predicted "
            f"{r0['predicted_gb'] * 1e3:,.0f} MB; step {r0['timing']['median_s'] * 1e3:,.1f} ms (median)")


def step_report(results: dict[str, Any], core: dict[str, list[dict[str, Any]]], name: str,
                against: str | None = None) -> str:
    """Markdown: the run ``name``'s memory per rank (measured, predicted) and step time, and its step time against
    the run ``against`` written by ``dlo.measure.conclude`` (recorded in ``results``)."""
    lines = [_mb(core[name])]
    if against is not None:
        a, b = core[name][0], core[against][0]
        if a["status"] == "ok" and b["status"] == "ok":
            lines.append(conclude(results, a["timing"], b["timing"], a_label=f"The step of {name}",
                                  b_label=f"the step of {against}"))
            lines.append(f"Peak memory per rank: {max(r['peak_memory_gb'] for r in core[name]) * 1e3:,.0f} MB "
                         f"against {max(r['peak_memory_gb'] for r in core[against]) * 1e3:,.0f} MB for {against}.")
        else:
            lines.append(f"No comparison with {against}: " + ", ".join(
                f"{r['run']} {r['status']}" for r in (a, b) if r["status"] != "ok"))
    results.setdefault("core", {})[name] = summary(core[name]).reset_index().to_dict(orient="records")
    return "\n".join(f"* {line}" for line in lines)


def closing_runs(settings: dict[str, Any], device: Any, compile_on_cpu: bool):
    """The closing launch's runs: every configuration (steps 0-8), the batch sweep and the prefetch runs, and
    the configurations this device cannot run, each with its reason."""
    P = settings["precision"]  # the precision of the FSDP steps after step 2 (fp32 on CPU: bf16 is emulated there)
    runs = [{"name": "0 DDP", "strategy": "ddp"}, {"name": "1 FSDP fp32", "strategy": "fsdp"},
            {"name": "2 FSDP bf16", "strategy": "fsdp", "precision": "bf16"},
            {"name": "3 + activation ckpt", "strategy": "fsdp", "precision": P, "checkpointing": True},
            {"name": "4 reshard=False", "strategy": "fsdp", "precision": P, "no_reshard": True},
            {"name": "7 DCP save/resume", "strategy": "fsdp", "precision": P, "resume_check": True},
            ] + [{"name": f"8 DeepSpeed ZeRO-{z}", "strategy": f"zero{z}", "precision": P} for z in (1, 2, 3)]
    skipped = {}
    try:
        ref.offload_policy(device, True)  # refuses a device without GPU memory to move state from
        runs.insert(5, {"name": "5 CPU offload", "strategy": "fsdp", "precision": P, "offload": True})
    except ValueError as exc:
        skipped["5 CPU offload"] = str(exc)
    if device.type == "cuda" or compile_on_cpu:
        runs.insert(6, {"name": "6 + torch.compile", "strategy": "fsdp", "precision": P, "compile": True})
    else:
        skipped["6 + torch.compile"] = ("not run on the CPU in this profile: the first compiled step costs ~40 s of "
                                        "CPU time (set compile_on_cpu=True, or run profile='full' on GPUs)")
    sweep = [{"name": f"sweep {s} b{b}", "strategy": s, "precision": P if s != "ddp" else "fp32",
              "global_batch": b * settings["nproc"]} for s in ("ddp", "fsdp") for b in settings["sweep"]]
    # the compute-only baseline first (the FSDP runs subtract its step time), then FSDP with each prefetch mode
    prefetch = [{"name": "prefetch: compute only", "compute_only": True}] + [
        {"name": f"prefetch: {mode}", "prefetch": mode} for mode in ref.PREFETCH_MODES]
    for r in prefetch:
        r.update(strategy="fsdp", precision=P, global_batch=settings["prefetch_per_rank_batch"] * settings["nproc"],
                 timed_repeats=settings["prefetch_repeats"], warmup_max_calls=settings["prefetch_warmup_max"])
    return runs + sweep + prefetch, skipped


def summary(recs: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per run: throughput and MFU as rank 0 reports them (the same step times on all ranks), the worst
    rank's peak memory, the calculator's prediction, the losses averaged over the ranks."""
    rows = []
    for name in dict.fromkeys(r["run"] for r in recs):
        rr = [r for r in recs if r["run"] == name]
        r0 = rr[0]
        row = {"run": name, "strategy": r0["strategy"], "precision": r0["precision"],
               "global_batch": r0["global_batch"], "status": r0["status"], "predicted_MB": r0["predicted_gb"] * 1e3}
        if r0["status"] == "ok":
            row.update(tokens_per_s=r0["tokens_per_s"], MFU=r0["mfu"],
                       peak_MB=max(r["peak_memory_gb"] for r in rr) * 1e3, memory_kind=r0["memory_kind"],
                       median_step_ms=r0["median_step_s"] * 1e3,
                       first_loss=sum(r["losses"][0] for r in rr) / len(rr),
                       last_loss=sum(r["losses"][-1] for r in rr) / len(rr))
        rows.append(row)
    return pd.DataFrame(rows).set_index("run")


def prefetch_table(records: list[dict[str, Any]]) -> pd.DataFrame:
    """The prefetch runs of the closing launch (rank 0: the ranks agree on the times): step time, spread,
    collectives counted per step, exposed communication (step minus the compute-only step) and its band."""
    ms = lambda v: None if v is None else v * 1e3  # noqa: E731
    rows = []
    for r in (r for r in records if r["run"].startswith("prefetch") and r["rank"] == 0):
        row = {"run": r["run"], "status": r["status"]}
        if r["status"] == "ok":
            t, coll = r["timing"], r["collectives_per_step"]
            row.update(median_ms=ms(t["median_s"]), q25_ms=ms(t["q25_s"]), q75_ms=ms(t["q75_s"]),
                       spread=t["spread"], steady=t["steady"],
                       all_gathers=coll.get("all_gather", {}).get("count", 0),
                       reduce_scatters=coll.get("reduce_scatter", {}).get("count", 0),
                       comm_MiB=r["collective_bytes_per_step"] / 2**20, exposed_ms=ms(r["exposed_comm_s"]),
                       exposed_low_ms=ms(r["exposed_comm_low_s"]), exposed_high_ms=ms(r["exposed_comm_high_s"]))
        rows.append(row)
    return pd.DataFrame(rows).set_index("run")


def prefetch_plot(prefetch: pd.DataFrame, path: str | Path | None = None) -> plt.Figure:
    """Step time of each prefetch run (median, interquartile range) and the communication it leaves exposed."""
    ok = prefetch[prefetch["status"] == "ok"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.2))
    colors = ["grey", "tab:blue", "tab:red", "tab:green"]
    a1.bar([n.removeprefix("prefetch: ") for n in ok.index], ok["median_ms"],
           yerr=[ok["median_ms"] - ok["q25_ms"], ok["q75_ms"] - ok["median_ms"]], capsize=4, color=colors[:len(ok)])
    a1.set(ylabel="ms per step", title="step time (median, bars: interquartile range)")
    fs = ok[ok["exposed_ms"].notna()] if "exposed_ms" in ok else ok.iloc[:0]
    if len(fs):
        a2.bar([n.removeprefix("prefetch: ") for n in fs.index], fs["exposed_ms"],
               yerr=[fs["exposed_ms"] - fs["exposed_low_ms"], fs["exposed_high_ms"] - fs["exposed_ms"]],
               capsize=4, color=colors[1:1 + len(fs)])
    a2.axhline(0, color="black", linewidth=0.8)
    a2.set(ylabel="ms per step", title="exposed communication: step − compute-only step")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig
