"""DataLoader tuning: see where the time goes, then pick the cheapest setting that keeps the model fed.

Modules: ``trial`` (what a trial measured, the transforms), ``profiling`` (running a trial, the overlapped
copy), ``advice`` (choosing a setting, core and shared-memory budgets); the charts are in
:mod:`dlo.lessons.loader_plots`.

A training step has two halves that can overlap: *producing* a batch (read, decode, augment, collate:
CPU work, in the DataLoader) and *consuming* it (copy to the device, forward, backward, step). With
``num_workers=0`` they run one after the other in the training process. With workers they run in other
processes, ``prefetch_factor`` batches ahead per worker, so the training loop only waits when the workers
fall behind. The question of this lesson is therefore not "how fast is my loader" but "how long does the
training loop *wait* for it":

* :func:`profile_loader` runs a loader for a few batches and measures, per iteration, the time blocked in
  ``next(iterator)`` (``wait``), the host-to-device copy (``copy``) and the step you pass (``compute``),
  plus the first-batch latency (starting the workers) and the memory of the main process and its workers.
  From pinned batches with ``non_blocking=True`` it runs the loop that lets the copy overlap the compute
  (next batch copied on a copy stream while the step runs, no synchronisation per copy) and measures the
  overlap with device events (:class:`TransferOps`); :func:`overlap_sentence` says what it showed.
  The result is a :class:`LoaderTrial`: ``.row()`` for a table of settings, ``.timeline()`` per iteration.
* ``loader_plots.plot_timeline`` draws those iterations like a profiler's timeline; ``loader_plots.plot_trials``
  compares settings; :func:`compare_settings` times them again interleaved and :func:`keep_sentence` picks
  the one to keep with the decision rule (:func:`best_setting`: the older rule on single trials).
* :func:`heavy_transform` makes the loader's work heavy enough to matter (RandAugment, random resized
  crops), :func:`light_transform` is the evaluation pipeline for comparison.
* :func:`epoch_start_latency` shows what ``persistent_workers=True`` buys: no worker restart per epoch
  (:func:`epoch_starts_interleaved`: two loaders' epochs in turns, for a decision).
* :func:`core_budget` and :func:`shm_status` answer the two practical questions on a cluster: how many
  workers can this rank afford, and why did a run die with "Bus error" (shared memory).

Import ``dlo`` before ``torchvision`` (this module does it for you through ``dlo.data``).
"""
from __future__ import annotations

from .trial import LOADER_KNOBS, LoaderTrial, heavy_transform, light_transform, loader_settings
from .profiling import TransferOps, epoch_start_latency, overlap_seconds, overlap_sentence, profile_loader
from .advice import SHM_PATH, best_setting, core_budget, row_labels, shm_status
from .compare import compare_settings, epoch_starts_interleaved, keep_sentence

__all__ = [
    "LOADER_KNOBS", "LoaderTrial", "heavy_transform", "light_transform", "loader_settings",
    "TransferOps", "epoch_start_latency", "overlap_seconds", "overlap_sentence", "profile_loader",
    "SHM_PATH", "best_setting", "core_budget", "row_labels", "shm_status",
    "compare_settings", "epoch_starts_interleaved", "keep_sentence",
]
