"""Where a model's training memory goes, per GPU: one bar per strategy (DDP, ZeRO-1, ZeRO-2, ZeRO-3 / FSDP), cut
into the memory calculator's own terms (weights, gradients, fp32 master weights, optimizer states, gathered layers,
activations), drawn to scale against the GPU's memory.

The segments are :func:`dlo.measure.memory.per_gpu_memory`'s numbers for the model the notebook uses, so the
picture and the calculator cannot disagree (``tests/test_figures_memory.py`` compares them).
"""
from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt

from dlo.lessons.figures.style import PALETTE, box, canvas, label, legend, save
from dlo.measure import memory as M

#: The calculator's terms, in the order the bars stack them, with their colour and legend text.
TERMS = {
    "weights": ("#4C72B0", "weights"),
    "weight_copies": ("#64B5CD", "bf16 weight copies"),
    "gradients": ("#DD8452", "gradients"),
    "master_weights": ("#937860", "fp32 master weights"),
    "optimizer_states": ("#8172B3", "optimizer states"),
    "gathered": ("#55A868", "gathered layers (ZeRO-3)"),
    "activations": ("#C44E52", "activations"),
}
STRATEGY_NAMES = {"ddp": "DDP", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "ZeRO-3", "fsdp": "ZeRO-3 / FSDP"}
WIDTH = 20.0  # data units of the longest bar (or of the GPU's memory, when it is longer)
ROW = 1.3     # data units between two bars


def memory_bars(model: M.TransformerConfig, n_gpus: int, *, strategies=("ddp", "zero1", "zero2", "fsdp"),
                batch: int = 1, seq_len: int = 4096, optimizer: str = "adamw", precision: str = "bf16_mixed",
                checkpointing: bool = False) -> dict[str, dict[str, int]]:
    """The bytes each bar shows: ``{strategy: per_gpu_memory(...)}``, the calculator's terms for one GPU."""
    return {s: M.per_gpu_memory(model, n_gpus, strategy=s, optimizer=optimizer, precision=precision, batch=batch,
                                seq_len=seq_len, checkpointing=checkpointing) for s in strategies}


def memory_per_gpu(model: M.TransformerConfig, n_gpus: int = 8, *, strategies=("ddp", "zero1", "zero2", "fsdp"),
                   batch: int = 1, seq_len: int = 4096, gpu_memory_gb: float | None = 80, optimizer: str = "adamw",
                   precision: str = "bf16_mixed", checkpointing: bool = False,
                   path: str | Path | None = None) -> plt.Figure:
    """One horizontal bar per strategy: what one of ``n_gpus`` GPUs holds to train ``model`` (a batch of
    ``batch`` x ``seq_len`` tokens per GPU), segment by segment, with the GPU's memory as a dashed line. Each
    segment is a box tagged ``("segment", strategy, term, bytes)``."""
    bars = memory_bars(model, n_gpus, strategies=strategies, batch=batch, seq_len=seq_len, optimizer=optimizer,
                       precision=precision, checkpointing=checkpointing)
    capacity = gpu_memory_gb * M.GB if gpu_memory_gb else 0
    longest = max([b["total"] for b in bars.values()] + [capacity])
    scale = WIDTH / longest  # data units per byte
    height = ROW * len(bars) + 1.6
    fig, ax = canvas(WIDTH + 13, height, inches_per_unit=0.42,
                     title=f"{model.name or 'model'}: memory of one of {n_gpus} GPUs, AdamW bf16 mixed, "
                           f"{batch} x {seq_len} tokens per GPU" + (", checkpointing" if checkpointing else ""))
    x0 = 4.0
    for row, (strategy, terms) in enumerate(bars.items()):
        y = height - 1.2 - ROW * (row + 1)
        label(ax, x0 - 0.2, y + 0.45, STRATEGY_NAMES.get(strategy, strategy), ha="right", weight="bold")
        x = x0
        for term, (color, _) in TERMS.items():
            nbytes = terms.get(term, 0)
            if not nbytes:
                continue
            w = nbytes * scale
            text = f"{nbytes / M.GB:.0f}" if w > 1.1 else ""
            box(ax, x, y, w, 0.9, text, color=color, fontsize=7, text_color="white",
                tag=("segment", strategy, term, nbytes))
            x += w
        label(ax, x + 0.2, y + 0.45, f"{terms['total'] / M.GB:.1f} GB", fontsize=8)
    if capacity:
        cx = x0 + capacity * scale
        ax.plot([cx, cx], [0.2, height - 1.0], ls="--", color=PALETTE["compute"], lw=1.2)
        label(ax, cx, height - 0.8, f"one {gpu_memory_gb:g} GB GPU", ha="center", fontsize=8,
              color=PALETTE["compute"])
    used = [t for t in TERMS if any(b.get(t, 0) for b in bars.values())]
    legend(ax, {TERMS[t][1]: TERMS[t][0] for t in used}, loc="center right", fontsize=7)
    return save(fig, path)


__all__ = ["TERMS", "STRATEGY_NAMES", "memory_bars", "memory_per_gpu"]
