"""The input pipeline of a DataLoader, drawn from the loader's own settings.

Worker processes (``num_workers``) each keep ``prefetch_factor`` batches ready in a queue; the training process
takes the next ready batch, in pinned (page-locked) or ordinary memory (``pin_memory``), and copies it to the
device (``non_blocking`` only pays with pinned batches) beside the training step. With ``num_workers=0`` the
training process loads each batch itself, between two steps.
"""
from __future__ import annotations

from typing import Any, Mapping

import matplotlib.pyplot as plt

from dlo.lessons.figures.style import PALETTE, arrow, box, canvas, label, save


def pipeline_settings(loader: Any) -> dict[str, Any]:
    """``num_workers``, ``prefetch_factor`` and ``pin_memory`` of a DataLoader (or of a mapping holding them), as
    the loader uses them: no queue without workers; torch's default of 2 batches per worker when left unset."""
    get = loader.get if isinstance(loader, Mapping) else (lambda k, d=None: getattr(loader, k, d))
    workers = int(get("num_workers", 0) or 0)
    prefetch = get("prefetch_factor", None)
    return {"num_workers": workers, "prefetch_factor": (int(prefetch) if prefetch else 2) if workers else 0,
            "pin_memory": bool(get("pin_memory", False))}


def input_pipeline(loader: Any, *, device: str = "GPU", path: str | None = None) -> plt.Figure:
    """The picture of ``loader``'s pipeline: its workers, their queues of ``prefetch_factor`` batches, the host
    memory the batches land in, the copy to ``device``, beside the training step (see the module)."""
    s = pipeline_settings(loader)
    n, pf, pinned = s["num_workers"], s["prefetch_factor"], s["pin_memory"]
    rows = max(n, 1)
    height = 1.2 * rows + 2.2
    fig, ax = canvas(21, height, title=f"DataLoader(num_workers={n}, prefetch_factor={pf if n else None}, "
                                        f"pin_memory={pinned})")
    top = height - 1.6
    ys = [top - 1.2 * i for i in range(rows)]
    mid = (ys[0] + ys[-1]) / 2
    if n == 0:
        box(ax, 0.2, mid - 0.4, 3.6, 0.8, "main process loads\nthe batch (between steps)", color=PALETTE["data"],
            fontsize=7, text_color="white", tag=("loader", "main"))
        label(ax, 4.1, mid + 0.6, "no queue: load, then train", fontsize=7)
        arrow(ax, (3.8, mid), (8.8, mid), tag=("to_host", "main"))
    for i, y in enumerate(ys if n else []):
        box(ax, 0.2, y - 0.4, 3.0, 0.8, f"worker {i}", color=PALETTE["data"], text_color="white",
            tag=("worker", i))
        arrow(ax, (3.2, y), (3.7, y))
        for j in range(pf):
            box(ax, 3.8 + j * 0.9, y - 0.3, 0.8, 0.6, f"b{j + 1}", color=PALETTE["highlight"], fontsize=6,
                tag=("slot", i, j))
        arrow(ax, (3.8 + pf * 0.9, y), (8.8, mid), tag=("to_host", i))
    if n:
        label(ax, 3.8, ys[0] + 0.7, f"queue: {pf} batch(es) ready per worker = {n * pf} in flight", fontsize=7)
    memory = "pinned (page-locked)\nhost memory" if pinned else "ordinary (pageable)\nhost memory"
    box(ax, 8.8, mid - 0.6, 3.4, 1.2, memory, color=PALETTE["memory"] if pinned else PALETTE["idle"],
        text_color="white" if pinned else None, fontsize=7, tag=("host", "pinned" if pinned else "pageable"))
    copy = "non_blocking copy" if pinned else "blocking copy"
    arrow(ax, (12.2, mid), (16.4, mid), copy, tag=("copy", "non_blocking" if pinned else "blocking"))
    label(ax, 14.3, mid - 0.35, "overlaps the step" if pinned else "the host waits for it", ha="center", fontsize=7)
    box(ax, 16.4, mid - 0.6, 4.4, 1.2, f"{device}: training step\nforward, backward, update",
        color=PALETTE["compute"], text_color="white", fontsize=7, tag=("step", device))
    label(ax, 0.2, 0.4, "the training loop waits only when no batch is ready", fontsize=7)
    return save(fig, path)
