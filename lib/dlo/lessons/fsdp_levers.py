"""The levers of a fast FSDP2 step (tp_fsdp/fsdp.ipynb, Going further) and the recorded GPU run they start from.

* :func:`recorded_run` reads the recorded H100 run of ``dlo gpu-check`` under ``results/`` (its provenance is in
  results/README.md) and :func:`recorded_sentence` says what it measured, with its hardware;
* :func:`lever_runs` builds the ladder of runs, one lever more each; :func:`levers_table`, :func:`levers_plot`
  and :func:`levers_sentence` read the records back;
* :func:`memory_gap` sets the recorded peak against the calculator's terms for the same step.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd

from dlo.measure import memory
from dlo.models import config as presets
from dlo.runtime.paths import ROOT

#: ``dlo gpu-check --only fsdp_mfu`` on one H100 80GB HBM3 (torch 2.11, commit dc0017b): see results/README.md.
RECORDED = ROOT / "results" / "gpu-check-h100-fsdp_mfu-2026-11-27.json"
#: The step that run timed (the benchmark's command at that commit): Llama 3.2 3B, FSDP2, bf16, full activation
#: checkpointing, 2 x 2048 tokens, the loss over the full logits, torch's default AdamW (foreach).
RECORDED_STEP = dict(batch=2, seq_len=2048, precision="bf16", checkpointing="full", optimizer_impl="foreach")


def recorded_run(path: str | Path = RECORDED) -> dict[str, Any]:
    """The recorded FSDP2 benchmark: MFU, tokens/s, peak memory per GPU, the GPU, torch and the date."""
    data = json.loads(Path(path).read_text())
    bench = next(r for r in data["results"] if r["benchmark"] == "fsdp_mfu")
    env = data["environment"]
    return {"file": Path(path).name, "gpu": env["gpu"], "torch": env["torch"], "date": env["date"][:10],
            "gpus": data["gpus"], "what": bench["what"], "mfu": bench["details"]["mfu"],
            "tokens_per_s": bench["details"]["tokens_per_s"], "peak_memory_gb": bench["details"]["peak_memory_gb"]}


def recorded_sentence(rec: dict[str, Any]) -> str:
    """What the recorded run measured, labelled as a recorded run with its hardware."""
    return (f"**A recorded run** (`results/{rec['file']}`: {rec['gpus']} x {rec['gpu']}, torch {rec['torch']}, "
            f"{rec['date']}): {rec['what']}, {RECORDED_STEP['batch']} x {RECORDED_STEP['seq_len']} tokens, ran at "
            f"**{rec['mfu']:.1%} MFU** ({rec['tokens_per_s']:,.0f} tokens/s) and peaked at "
            f"**{rec['peak_memory_gb']:.1f} GB**.")


def lever_runs(settings: dict[str, Any], device: Any, compile_on_cpu: bool) -> tuple[list[dict], dict[str, str]]:
    """The ladder of runs, each one lever more than the one before (fused AdamW, accumulation, chunked loss,
    selective checkpointing, then torch.compile on a GPU), and the runs left out with their reason."""
    P, n = settings["precision"], settings["nproc"]
    common = dict(strategy="fsdp", precision=P, seq_len=settings["seq_len"], steps=settings["levers_steps"],
                  warmup_steps=settings["levers_warmup"])
    one_batch = settings["levers_micro_batch"] * n  # sequences per step without accumulation
    accum = dict(grad_accum=settings["levers_accum"], global_batch=one_batch * settings["levers_accum"],
                 accum_sync="every" if n == 1 else "last")  # one GPU: no room for an unsharded fp32 gradient
    chunked = dict(loss="chunked", loss_chunk_tokens=settings["levers_chunk_tokens"])
    runs = [
        {"name": "L0 baseline (full ckpt)", "checkpointing": "full", "global_batch": one_batch},
        {"name": "L1 + fused AdamW", "checkpointing": "full", "global_batch": one_batch, "optimizer_impl": "fused"},
        {"name": "L2 + grad accumulation", "checkpointing": "full", "optimizer_impl": "fused", **accum},
        {"name": "L3 + chunked loss", "checkpointing": "full", "optimizer_impl": "fused", **accum, **chunked},
        {"name": "L4 + selective ckpt", "checkpointing": "selective", "optimizer_impl": "fused", **accum, **chunked},
    ]
    skipped = {}
    if device.type == "cuda" or compile_on_cpu:
        runs += [{"name": "L5 + torch.compile", "checkpointing": "selective", "optimizer_impl": "fused",
                  "compile": True, **accum, **chunked},
                 {"name": "L6 compile, no ckpt", "checkpointing": "none", "optimizer_impl": "fused", "compile": True,
                  **accum, **chunked}]
    else:
        skipped["L5-L6 torch.compile"] = ("not run on the CPU in this profile: the first compiled step costs ~40 s "
                                          "of CPU time (set compile_on_cpu=True, or run profile='full' on GPUs)")
    return [{**common, **r} for r in runs], skipped


def levers_table(records: list[dict[str, Any]], runs: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per lever run: batch, accumulation, checkpointing, loss, prediction; when it ran, tokens/s, MFU,
    HFU, the worst rank's peak, the AdamW and SDPA kernels that ran and the last loss."""
    rows = []
    for name in [r["name"] for r in runs]:
        rr = [r for r in records if r["run"] == name]
        r0 = rr[0]
        row = {"run": name, "status": r0["status"], "global_batch": r0["global_batch"], "grad_accum": r0["grad_accum"],
               "checkpointing": r0["checkpointing"], "loss": r0["loss"], "predicted_GB": r0["predicted_gb"]}
        if r0["status"] == "ok":
            row.update(tokens_per_s=r0["tokens_per_s"], MFU=r0["mfu"], HFU=r0["hfu"],
                       peak_GB=max(r["peak_memory_gb"] for r in rr), memory_kind=r0["memory_kind"],
                       adamw=r0["optimizer_impl_resolved"], sdpa="/".join(r0["sdpa_backends"]),
                       last_loss=sum(r["losses"][-1] for r in rr) / len(rr))
        rows.append(row)
    return pd.DataFrame(rows).set_index("run")


def levers_plot(levers: pd.DataFrame, path: str | Path | None = None) -> plt.Figure:
    """MFU (and HFU) or tokens/s of each lever run, and its peak memory against the calculator's prediction."""
    ok = levers[levers["status"] == "ok"]
    metric = "MFU" if len(ok) and ok["MFU"].notna().all() else "tokens_per_s"
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 3.4))
    a1.barh(ok.index[::-1], ok[metric][::-1], color="tab:blue", label=metric)
    if metric == "MFU":
        a1.barh(ok.index[::-1], (ok["HFU"] - ok["MFU"])[::-1], left=ok["MFU"][::-1], color="tab:orange",
                alpha=0.6, label="HFU - MFU (recomputation)")
        a1.axvline(0.4, color="k", ls="--", lw=1, label="40 % (torchtitan / Megatron on H100, REFERENCES.md)")
    a1.set(xlabel=metric, title="each run: one lever more")
    a1.legend(fontsize=7)
    if len(ok):
        a2.barh(ok.index[::-1], ok["peak_GB"][::-1], color="tab:green", label=f"measured ({ok['memory_kind'].iloc[0]})")
        a2.scatter(ok["predicted_GB"][::-1], ok.index[::-1], color="k", marker="x", zorder=3, label="predicted")
    a2.set(xlabel="GB per rank", title="peak memory")
    a2.legend(fontsize=7)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


def levers_sentence(levers: pd.DataFrame, device_type: str, model_name: str) -> str:
    """What the ladder reached, from its table (MFU on a GPU; on a CPU only which runs ran)."""
    ok = levers[levers["status"] == "ok"]
    if not len(ok):
        return "No lever run finished: see the status column."
    if not ok["MFU"].notna().all():
        return (f"On {device_type} MFU is not defined (no reference peak), and the {model_name}'s tiny matmuls say "
                f"nothing about the order of the levers on a GPU (the full profile's to show): here every lever "
                f"ran ({len(ok)} of {len(levers)} runs ok, SDPA {ok['sdpa'].iloc[-1]}).")
    base, best = ok.iloc[0], ok.loc[ok["MFU"].idxmax()]
    gains = ok["MFU"].diff().iloc[1:]
    return (f"From {base['MFU']:.1%} MFU ({base['tokens_per_s']:,.0f} tokens/s) the levers reach {best['MFU']:.1%} "
            f"(HFU {best['HFU']:.1%}) with '{best.name}'; the largest single step was '{gains.idxmax()}' "
            f"(+{gains.max():.1%} MFU); SDPA ran {best['sdpa']}; the 40 % reference is "
            f"{'reached' if best['MFU'] >= 0.4 else 'not reached'}.")


def memory_gap(rec: dict[str, Any]) -> tuple[pd.DataFrame, dict[str, float], str]:
    """The calculator's terms for the recorded step and for the same step with the levers, the gap between the
    recorded peak and the calculator, and one sentence saying it."""
    L3 = presets.LLAMA_3_2_3B
    b, s = RECORDED_STEP["batch"], RECORDED_STEP["seq_len"]
    old = memory.fsdp2_peak_memory(L3, 1, batch=b, seq_len=s, precision="bf16", checkpointing="full",
                                   optimizer_impl="foreach")
    held_logits = b * s * L3.vocab_size * 2  # the bf16 logits that loop still held during optimizer.step()
    new = memory.fsdp2_peak_memory(L3, 1, batch=b, seq_len=s, precision="bf16", checkpointing="selective",
                                   loss="chunked", loss_chunk_tokens=1024, optimizer_impl="fused", grad_accum=8,
                                   accum_sync="every")
    terms = pd.DataFrame({"recorded run (foreach, full loss, full ckpt)": old,
                          "levers (fused, chunked, selective)": new})
    terms = (terms.drop(index=["not_allocated_cuda_context"]) / memory.GB).round(2)
    explained = (old["total"] + held_logits) / memory.GB
    measured = rec["peak_memory_gb"]
    gap = {"measured_gb": measured, "optimizer_step_gb": old["optimizer_step"] / memory.GB,
           "forward_backward_gb": old["forward_backward"] / memory.GB, "held_logits_gb": held_logits / memory.GB,
           "explained_gb": explained, "levers_prediction_gb": new["total"] / memory.GB}
    sentence = (f"Recorded run ({rec['gpu']}): {measured:.2f} GB measured; the calculator: optimizer step "
                f"{gap['optimizer_step_gb']:.2f} GB (16 B/param + foreach's fp32 sqrt(v) "
                f"{old['optimizer_temporaries'] / memory.GB:.2f} GB) + {gap['held_logits_gb']:.2f} GB of logits "
                f"still held = {explained:.2f} GB, {abs(explained - measured) / measured:.1%} from the measurement; "
                f"with the levers the peak is the backward's, {gap['levers_prediction_gb']:.1f} GB.")
    return terms, gap, sentence
