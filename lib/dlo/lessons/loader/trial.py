"""What one DataLoader trial measured (:class:`LoaderTrial`: per-iteration wait, copy and compute, memory of
the main process and its workers), the transforms that make the loader's work heavy or light, and the
memory sampler."""
from __future__ import annotations

import math
import statistics
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterable

import torch

from dlo import data

from torchvision.transforms import v2  # noqa: E402  (after dlo.data, which prepares torchvision's import)


# The DataLoader attributes a trial records (and that the tables and charts are labelled with).
LOADER_KNOBS: tuple[str, ...] = (
    "num_workers", "batch_size", "pin_memory", "prefetch_factor", "persistent_workers", "drop_last",
)
MiB = 2**20
# "auto" uses PSS when one reading of the main process costs less than this; above, RSS (see profile_loader).
PSS_BUDGET_S = 0.002


# --------------------------------------------------------------------------------------------------------
# Transforms
# --------------------------------------------------------------------------------------------------------

def heavy_transform(size: int = 32) -> v2.Compose:
    """A CPU-heavy but realistic training pipeline: PIL image -> normalised float32 tensor ``[3, size, size]``.

    ``RandomResizedCrop(size, scale=(0.35, 1))`` (a random 35-100 % of the image, resized to ``size``),
    ``RandomHorizontalFlip``, ``RandAugment(num_ops=2, magnitude=9)`` (two random photometric/geometric ops
    per image, the recipe of many ImageNet trainings), then ``ToImage``, ``ToDtype(float32, scale=True)``
    and ``Normalize`` with the CIFAR-10 statistics. The augmentations run on the PIL image, before the
    conversion to a tensor, as in most training scripts: PIL's C code on one byte per value.

    It costs several times :func:`light_transform` per image (about 1 ms against 0.25 ms on one core for
    32 x 32), enough to make the training loop wait for its data when the loader runs in the main
    process. ``size`` > 32 upsamples (64, 96, 128, ...): more pixels per image, more work per image, as
    with larger images in real datasets, and bigger batches to move through shared memory.
    """
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        raise ValueError(f"size must be a positive integer (output side in pixels), got {size!r}")
    return v2.Compose([
        v2.RandomResizedCrop(size, scale=(0.35, 1.0), antialias=True),
        v2.RandomHorizontalFlip(),
        v2.RandAugment(num_ops=2, magnitude=9),
        v2.ToImage(),
        v2.ToDtype(torch.float32, scale=True),
        v2.Normalize(data.CIFAR10_MEAN, data.CIFAR10_STD),
    ])


def light_transform() -> v2.Compose:
    """The evaluation pipeline (:func:`dlo.data.loaders.test_transform`): conversion and normalisation only."""
    return data.test_transform()


# --------------------------------------------------------------------------------------------------------
# Memory of the main process and of its workers
# --------------------------------------------------------------------------------------------------------

def read_pss(pid: int) -> int:
    """Proportional set size in bytes, from /proc/<pid>/smaps_rollup (one kernel summary), else psutil."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import psutil

    return int(psutil.Process(pid).memory_full_info().pss)


class MemorySampler:
    """Memory of the main process and of a set of worker processes, in bytes, by PSS or RSS."""

    def __init__(self, metric: str) -> None:
        import psutil

        self._psutil = psutil
        self.main = psutil.Process()
        self._procs: dict[int, Any] = {}
        if metric not in ("auto", "pss", "rss"):
            raise ValueError(f"memory_metric must be 'auto', 'pss' or 'rss', got {metric!r}")
        if metric in ("auto", "pss"):
            try:
                t0 = time.perf_counter()
                read_pss(self.main.pid)
                cost = time.perf_counter() - t0
            except Exception:  # noqa: BLE001 - no /proc, no psutil support: RSS then
                if metric == "pss":
                    warnings.warn("PSS is not readable on this system: using RSS", UserWarning, stacklevel=3)
                metric = "rss"
            else:
                metric = "pss" if metric == "pss" or cost < PSS_BUDGET_S else "rss"
        self.metric = metric

    def _read(self, proc) -> int:
        try:
            if self.metric == "pss":
                return read_pss(proc.pid)
            return int(proc.memory_info().rss)
        except (self._psutil.Error, OSError, ValueError):
            return 0  # the process ended between listing and reading it

    def _proc(self, pid: int):
        if pid not in self._procs:
            self._procs[pid] = self._psutil.Process(pid)
        return self._procs[pid]

    def worker_processes(self, iterator, num_workers: int) -> list:
        """The loader's worker processes (and their own children): from the iterator when it says which,
        else every child of this process."""
        if not num_workers:
            return []
        psutil = self._psutil
        workers = getattr(iterator, "_workers", None)  # torch's multiprocessing iterator keeps them there
        if workers is None:
            try:
                return self.main.children(recursive=True)
            except psutil.Error:
                return []
        procs = []
        for w in workers:
            pid = getattr(w, "pid", None)
            if pid is None:
                continue
            try:
                proc = self._proc(pid)
                procs.append(proc)
                procs.extend(proc.children(recursive=True))
            except psutil.Error:
                continue
        return procs

    def sample(self, workers: Iterable) -> tuple[int, int]:
        return self._read(self.main), sum(self._read(p) for p in workers)


# --------------------------------------------------------------------------------------------------------
# One trial
# --------------------------------------------------------------------------------------------------------

def loader_settings(loader) -> dict[str, Any]:
    """The knobs of :data:`LOADER_KNOBS` as a DataLoader holds them (None for what it lacks).

    ``batch_size`` comes from the batch sampler when the loader was built with one. Note that torch
    stores ``prefetch_factor=None`` without workers and fills in 2 with workers when it was left unset.
    """
    out: dict[str, Any] = {}
    for knob in LOADER_KNOBS:
        value = getattr(loader, knob, None)
        if knob == "batch_size" and value is None:
            value = getattr(getattr(loader, "batch_sampler", None), "batch_size", None)
        if knob == "num_workers" and value is None:
            value = 0
        out[knob] = value
    return out


def trial_label(settings: dict[str, Any]) -> str:
    s = settings
    parts = [f"workers={s.get('num_workers')}"]
    if s.get("num_workers"):
        parts.append(f"prefetch={s.get('prefetch_factor')}")
        if s.get("persistent_workers"):
            parts.append("persistent")
    if s.get("pin_memory"):
        parts.append("pinned")
    parts.append(f"batch={s.get('batch_size')}")
    return " ".join(parts)


@dataclass
class LoaderTrial:
    """What :func:`profile_loader` measured on one loader setting.

    Per iteration ``i`` (lists of equal length): ``wait_s[i]`` blocked waiting for the batch (for ``i = 0``:
    from ``iter(loader)``, which starts the workers, to the first batch: ``first_batch_s``), ``copy_s[i]``
    the host-to-device copy, ``compute_s[i]`` the step, ``batch_sizes[i]`` its images, ``main_bytes[i]`` /
    ``workers_bytes[i]`` the memory sampled after it (empty without memory sampling).

    Iteration 0 pays one-off costs (starting workers, first fills of the prefetch queues, warm-ups of the
    step): it is reported as ``first_batch_s`` and left out of every steady-state number (``throughput``,
    medians, ``wait_fraction``).
    """

    settings: dict[str, Any]
    wait_s: list[float]
    copy_s: list[float]
    compute_s: list[float]
    batch_sizes: list[int]
    first_batch_s: float
    iter_s: float = 0.0  # the iter(loader) call alone (forking the workers), part of first_batch_s
    main_bytes: list[int] = field(default_factory=list)
    workers_bytes: list[int] = field(default_factory=list)
    memory_metric: str | None = None  # "pss", "rss" or None (not sampled)
    memory_overhead_s: float = 0.0  # time spent sampling memory, excluded from every timing
    device: str = "cpu"
    label: str | None = None
    # How the copies were issued (see profile_loader): "serial" (copy, step, synchronise, one step at a time)
    # or "overlap" (pinned batches, non_blocking copies on a copy stream while the previous step computes).
    mode: str = "serial"
    pinned: bool | None = None  # whether the loader's batches were in page-locked memory
    overlap_s: list[float] = field(default_factory=list)  # per iteration: copy time spent under a compute
    syncs: int = 0  # times the loop made the host wait for the device
    steady_wall_s: float | None = None  # overlap mode: host seconds of iterations 1..n-1, final sync included

    def __post_init__(self) -> None:
        if self.label is None:
            self.label = trial_label(self.settings)
        if not self.overlap_s:
            self.overlap_s = [0.0] * len(self.wait_s)

    # -- steady state (iterations 1..n-1) --

    @property
    def n_iters(self) -> int:
        return len(self.wait_s)

    @property
    def n_images(self) -> int:
        """Images in all iterations, the first one included."""
        return int(sum(self.batch_sizes))

    @property
    def steady_s(self) -> float:
        """Seconds of iterations 1..n-1: wait + copy + compute one after the other ("serial"), or the host's
        clock over those iterations up to the final synchronisation ("overlap", where they overlap)."""
        if self.steady_wall_s is not None:
            return float(self.steady_wall_s)
        return float(sum(self.wait_s[1:]) + sum(self.copy_s[1:]) + sum(self.compute_s[1:]))

    @property
    def throughput(self) -> float:
        """Images per second in the steady state (iterations 1..n-1); NaN with fewer than 2 iterations."""
        if self.n_iters < 2 or self.steady_s <= 0:
            return math.nan
        return sum(self.batch_sizes[1:]) / self.steady_s

    def _median(self, values: list[float]) -> float:
        return statistics.median(values[1:]) if len(values) > 1 else math.nan

    @property
    def median_wait_s(self) -> float:
        return self._median(self.wait_s)

    @property
    def median_copy_s(self) -> float:
        return self._median(self.copy_s)

    @property
    def median_compute_s(self) -> float:
        return self._median(self.compute_s)

    @property
    def wait_fraction(self) -> float:
        """Share of the steady-state time the training loop spent waiting for the loader (copy excluded).
        Near 1: input-bound, the model starves; near 0: the loader keeps up."""
        return sum(self.wait_s[1:]) / self.steady_s if self.n_iters > 1 and self.steady_s > 0 else math.nan

    @property
    def copy_fraction(self) -> float:
        return sum(self.copy_s[1:]) / self.steady_s if self.n_iters > 1 and self.steady_s > 0 else math.nan

    @property
    def copy_hidden(self) -> float:
        """Share of the steady-state copy time that ran while a step was computing (device clock): 0 when
        copies and steps run one after the other, near 1 when the copies are hidden. NaN without copy time."""
        total = sum(self.copy_s[1:])
        return sum(self.overlap_s[1:]) / total if self.n_iters > 1 and total > 0 else math.nan

    # -- memory --

    @property
    def peak_main_bytes(self) -> int | None:
        return max(self.main_bytes) if self.main_bytes else None

    @property
    def peak_workers_bytes(self) -> int | None:
        return max(self.workers_bytes) if self.workers_bytes else None

    @property
    def peak_total_bytes(self) -> int | None:
        """Peak of (main + workers) sampled together: the footprint the machine must hold."""
        if not self.main_bytes:
            return None
        return max(m + w for m, w in zip(self.main_bytes, self.workers_bytes))

    # -- tables --

    def row(self) -> dict[str, Any]:
        """One flat record (settings + summary) for a pandas DataFrame of trials. Memory in MiB."""
        def mib(v: int | None) -> float | None:
            return None if v is None else v / MiB

        return {
            "label": self.label,
            **self.settings,
            "device": self.device,
            "n_iters": self.n_iters,
            "n_images": self.n_images,
            "first_batch_s": self.first_batch_s,
            "median_wait_ms": self.median_wait_s * 1000,
            "median_copy_ms": self.median_copy_s * 1000,
            "median_compute_ms": self.median_compute_s * 1000,
            "mode": self.mode,
            "pinned": self.pinned,
            "copy_hidden": self.copy_hidden,
            "syncs": self.syncs,
            "wait_fraction": self.wait_fraction,
            "throughput": self.throughput,
            "peak_main_mib": mib(self.peak_main_bytes),
            "peak_workers_mib": mib(self.peak_workers_bytes),
            "peak_total_mib": mib(self.peak_total_bytes),
            "memory_metric": self.memory_metric,
        }

    def timeline(self):
        """Per-iteration pandas DataFrame: ``iteration, start_s, wait_s, copy_s, overlap_s, compute_s,
        batch_size, steady`` (False for iteration 0), and ``main_mib, workers_mib`` when memory was sampled.
        ``start_s`` is the iteration's start on the trial's clock (memory sampling left out), counting only the
        copy time not hidden under a compute (``copy_s - overlap_s``)."""
        import pandas as pd

        starts, t = [], 0.0
        for w, c, o, k in zip(self.wait_s, self.copy_s, self.overlap_s, self.compute_s):
            starts.append(t)
            t += w + c - o + k
        df = pd.DataFrame({
            "iteration": range(self.n_iters), "start_s": starts, "wait_s": self.wait_s, "copy_s": self.copy_s,
            "overlap_s": self.overlap_s, "compute_s": self.compute_s, "batch_size": self.batch_sizes,
            "steady": [i > 0 for i in range(self.n_iters)],
        })
        if self.main_bytes:
            df["main_mib"] = [b / MiB for b in self.main_bytes]
            df["workers_mib"] = [b / MiB for b in self.workers_bytes]
        return df

    def __str__(self) -> str:
        mem = (f", peak {self.peak_total_bytes / MiB:.0f} MiB {self.memory_metric} "
               f"(workers {self.peak_workers_bytes / MiB:.0f})" if self.main_bytes else "")
        return (f"{self.label}: {self.throughput:,.0f} img/s, waiting {self.wait_fraction:.0%} of the time, "
                f"first batch after {self.first_batch_s:.2f} s{mem}")
