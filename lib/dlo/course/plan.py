"""The course's plan: four days of about three hours of practical work, each notebook's day, whether it is core
or optional ("going further"), and the minutes its core path takes on one GPU.

Every notebook's first cell states the same in one line (``BOX``), written by hand and held to this table by
``tests/test_course_plan.py``; the README's plan is :func:`plan_table`, pasted, and held to it the same way.

How the minutes are estimated (each notebook's box splits them the same way):
- reading: the core path's prose at about 150 words a minute (technical text, read once, with the figures);
- writing: per exercise step of the core path, 4 minutes plus 1 minute per line of the reference solution
  (reading the stub and the hint included), the check run included;
- running: the core path's cells on one GPU in the full profile (recorded runs where there are some, otherwise
  the profile's sizes against the H100 run in ``results/``), rounded up to 5 minutes.
The CPU smoke profile's running time is given beside it, measured by ``make test``'s notebook stage.
"""
from __future__ import annotations

import re
from typing import NamedTuple

#: Minutes of practical work in a day of the course.
DAY_MINUTES = 180


class Entry(NamedTuple):
    notebook: str  # source notebook, relative to the project root
    day: int
    core: bool  # part of the day's core path; False: going further
    minutes: int  # its own core path on one GPU: reading + writing + running
    topic: str


PLAN: list[Entry] = [
    Entry("Jour1/jour1.ipynb", 1, True, 90, "one GPU: timing a step, the optimisation ladder, the profiler"),
    Entry("Jour1/shapes.ipynb", 1, True, 35, "hardware-aware shapes: roofline, alignment, wave quantization"),
    Entry("Jour2/dataloader.ipynb", 2, True, 45, "feeding the GPU: DataLoader workers, pinning, prefetch"),
    Entry("Jour2/ddp.ipynb", 2, True, 85, "collectives, then data parallelism with DDP"),
    Entry("Jour2/augment.ipynb", 2, True, 45, "augmentation on the GPU: RandAugment, batched MixUp/CutMix"),
    Entry("Jour2/dp_scratch.ipynb", 2, False, 105, "DDP written by hand: all-reduce, overlap, buckets"),
    Entry("Jour3/optimizers.ipynb", 3, True, 50, "large batches: schedules, warm-up, LAMB/LARS, accumulation"),
    Entry("Jour3/jit.ipynb", 3, True, 40, "compilation: torch.compile, export, graph breaks"),
    Entry("Jour3/recipes.ipynb", 3, True, 50, "training recipes: resizing, smoothing, EMA, TTA"),
    Entry("Jour3/transfer.ipynb", 3, False, 40, "transfer learning: frozen backbone vs fine-tuning"),
    Entry("Jour4/llm_memory.ipynb", 4, True, 30, "where an LLM's memory goes, and what fits"),
    Entry("tp_fsdp/fsdp.ipynb", 4, True, 60, "sharding a Llama with FSDP2"),
    Entry("tp_pipeline/pipeline.ipynb", 4, True, 60, "pipeline parallelism: GPipe, 1F1B, the bubble"),
    Entry("tp_tensor_parallel/tensor_parallel.ipynb", 4, False, 120, "tensor parallelism written by hand"),
    Entry("tp_tensor_parallel/attention.ipynb", 4, False, 47, "attention kernels: SDPA backends, memory"),
    Entry("tp_tensor_parallel/context_parallel.ipynb", 4, False, 40, "context parallelism: ring attention"),
    Entry("tp_fsdp/experts.ipynb", 4, False, 60, "mixture of experts and expert parallelism"),
    Entry("tp_pipeline/grid.ipynb", 4, False, 34, "PP x TP x DP on one grid of processes"),
    Entry("tp_fsdp/apis.ipynb", 4, False, 50, "the same training through Accelerate and Fabric"),
    Entry("Jour4/hpo.ipynb", 4, False, 40, "hyper-parameter search: Optuna and Ray Tune"),
    Entry("Jour4/inference.ipynb", 4, False, 60, "inference: distillation, quantization, pruning, KV cache"),
    Entry("Jour4/cifar_race.ipynb", 4, False, 60, "the capstone: a race to 94 % on CIFAR-10"),
]

#: The line every notebook's first cell carries, e.g.
#: ``> **Day 2 · core** · about **85 min** on one GPU (reading 20 · writing 35 · running 30) · CPU smoke: 12 min to run``
BOX = re.compile(r"\*\*Day (?P<day>\d) · (?P<role>core|optional)\*\* · about \*\*(?P<total>\d+) min\*\* on one GPU "
                 r"\(reading (?P<reading>\d+) · writing (?P<writing>\d+) · running (?P<running>\d+)\)"
                 r" · CPU smoke: (?P<smoke>\d+) min to run")


def entry(notebook: str) -> Entry:
    """The plan's entry for ``notebook`` (a path relative to the project root)."""
    for e in PLAN:
        if e.notebook == notebook:
            return e
    raise KeyError(f"{notebook} is not in the course plan (dlo.course.plan.PLAN)")


def day_minutes(day: int) -> int:
    """Minutes of the day's core path."""
    return sum(e.minutes for e in PLAN if e.day == day and e.core)


def plan_table() -> str:
    """The plan as the README shows it: one row per day, core notebooks then optional ones, with minutes."""
    rows = ["| day | core path (about 3 h on one GPU) | going further (optional) |", "| --- | --- | --- |"]
    for day in sorted({e.day for e in PLAN}):
        core = [e for e in PLAN if e.day == day and e.core]
        extra = [e for e in PLAN if e.day == day and not e.core]
        cell = lambda es: "<br>".join(f"`{e.notebook}` ({e.minutes} min): {e.topic}" for e in es) or "–"
        rows.append(f"| {day} ({day_minutes(day)} min) | {cell(core)} | {cell(extra)} |")
    return "\n".join(rows)
