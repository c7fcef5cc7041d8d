"""DataLoader tuning: see where the time goes, then pick the cheapest setting that keeps the model fed.

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
* :func:`plot_timeline` draws those iterations like a profiler's timeline; :func:`plot_trials` compares
  settings; :func:`best_setting` picks the one to keep.
* :func:`heavy_transform` makes the loader's work heavy enough to matter (RandAugment, random resized
  crops), :func:`light_transform` is the evaluation pipeline for comparison.
* :func:`epoch_start_latency` shows what ``persistent_workers=True`` buys: no worker restart per epoch.
* :func:`core_budget` and :func:`shm_status` answer the two practical questions on a cluster: how many
  workers can this rank afford, and why did a run die with "Bus error" (shared memory).

Import ``dlo`` before ``torchvision`` (this module does it for you through ``dlo.data``).
"""
from __future__ import annotations

import contextlib
import math
import os
import shutil
import statistics
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

from dlo import data
from dlo.runtime.device import synchronize

from torchvision.transforms import v2  # noqa: E402  (after dlo.data, which prepares torchvision's import)

# The DataLoader attributes a trial records (and that the tables and charts are labelled with).
LOADER_KNOBS: tuple[str, ...] = (
    "num_workers", "batch_size", "pin_memory", "prefetch_factor", "persistent_workers", "drop_last",
)
SHM_PATH = Path("/dev/shm")  # where worker processes put the batches they hand to the main process (Linux)
_MiB = 2**20
# "auto" uses PSS when one reading of the main process costs less than this; above, RSS (see profile_loader).
_PSS_BUDGET_S = 0.002


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

def _read_pss(pid: int) -> int:
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


class _MemorySampler:
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
                _read_pss(self.main.pid)
                cost = time.perf_counter() - t0
            except Exception:  # noqa: BLE001 - no /proc, no psutil support: RSS then
                if metric == "pss":
                    warnings.warn("PSS is not readable on this system: using RSS", UserWarning, stacklevel=3)
                metric = "rss"
            else:
                metric = "pss" if metric == "pss" or cost < _PSS_BUDGET_S else "rss"
        self.metric = metric

    def _read(self, proc) -> int:
        try:
            if self.metric == "pss":
                return _read_pss(proc.pid)
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


def _label(settings: dict[str, Any]) -> str:
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
            self.label = _label(self.settings)
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
            return None if v is None else v / _MiB

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
            df["main_mib"] = [b / _MiB for b in self.main_bytes]
            df["workers_mib"] = [b / _MiB for b in self.workers_bytes]
        return df

    def __str__(self) -> str:
        mem = (f", peak {self.peak_total_bytes / _MiB:.0f} MiB {self.memory_metric} "
               f"(workers {self.peak_workers_bytes / _MiB:.0f})" if self.main_bytes else "")
        return (f"{self.label}: {self.throughput:,.0f} img/s, waiting {self.wait_fraction:.0%} of the time, "
                f"first batch after {self.first_batch_s:.2f} s{mem}")


# --------------------------------------------------------------------------------------------------------
# The device calls of a trial, behind small methods
# --------------------------------------------------------------------------------------------------------

class _HostEvent:
    """A host-clock stand-in for ``torch.cuda.Event(enable_timing=True)`` (CPU runs)."""

    def __init__(self) -> None:
        self.t: float | None = None

    def record(self, stream=None) -> None:
        self.t = time.perf_counter()


class TransferOps:
    """Every device-specific call :func:`profile_loader` makes, one small method each, so that its loop runs
    unchanged on a CPU (and in tests, with a recording stand-in).

    On a GPU: a copy stream (``torch.cuda.Stream``), timing events (``torch.cuda.Event``, read after the final
    synchronisation, so recording them never blocks the host), ``wait_stream`` (the step's stream waits on the
    GPU for the copy, the host does not), ``record_stream`` (the caching allocator must not reuse a batch the
    copy stream allocated while the step's stream still reads it) and ``torch.cuda.synchronize``.
    On a CPU: no stream, host-clock events, ``synchronize`` does nothing; ``.to("cpu")`` returns the tensor
    itself. ``syncs`` counts the synchronisations the loop asked for."""

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.syncs = 0

    def is_pinned(self, x) -> bool:
        """Whether ``x`` is in page-locked host memory (only then can a copy run while the host goes on)."""
        try:
            return isinstance(x, torch.Tensor) and x.is_pinned()
        except RuntimeError:  # no accelerator in this build
            return False

    def new_stream(self):
        return torch.cuda.Stream(self.device) if self.cuda else None

    def on_stream(self, stream):
        return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()

    def event(self):
        return torch.cuda.Event(enable_timing=True) if self.cuda else _HostEvent()

    def record(self, event, stream=None) -> None:
        if self.cuda:
            event.record(stream if stream is not None else torch.cuda.current_stream(self.device))
        else:
            event.record()

    def copy(self, x, non_blocking: bool):
        return x.to(self.device, non_blocking=non_blocking) if isinstance(x, torch.Tensor) else x

    def wait_for(self, stream) -> None:
        """The step's (current) stream waits for everything queued on ``stream``: on the GPU, not the host."""
        if self.cuda and stream is not None:
            torch.cuda.current_stream(self.device).wait_stream(stream)

    def hand_over(self, *tensors) -> None:
        """Tensors made on the copy stream are now used by the current stream (``record_stream``)."""
        if self.cuda:
            for t in tensors:
                if isinstance(t, torch.Tensor) and t.is_cuda:
                    t.record_stream(torch.cuda.current_stream(self.device))

    def synchronize(self) -> None:
        self.syncs += 1
        synchronize(self.device)

    def seconds(self, start, end) -> float:
        """Seconds from event ``start`` to event ``end`` (both recorded, the device synchronised since)."""
        if self.cuda:
            return start.elapsed_time(end) / 1000.0
        return end.t - start.t


def overlap_seconds(copies: list[tuple[float, float]], computes: list[tuple[float, float]]) -> list[float]:
    """For each copy interval ``(start, end)``, the seconds it spent while some compute interval was running
    (its intersection with the union of the computes; times on one clock)."""
    merged: list[list[float]] = []
    for a, b in sorted(computes):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [sum(max(0.0, min(b, e) - max(a, s)) for s, e in merged) for a, b in copies]


def _split_batch(batch) -> tuple[Any, Any]:
    if isinstance(batch, torch.Tensor):
        return batch, None
    if isinstance(batch, (tuple, list)) and len(batch) >= 2:
        return batch[0], batch[1]
    raise TypeError(f"profile_loader expects batches (images, labels, ...) or a tensor, got {type(batch).__name__}: "
                    f"give the dataset a transform that makes tensors, e.g. transform=light_transform()")


def _count(images) -> int:
    try:
        return len(images)
    except TypeError:
        return 1


def profile_loader(loader, n_iters: int, *, compute: Callable[[Any, Any], Any] | None = None,
                   device: str | torch.device = "cpu", non_blocking: bool = False, sample_memory: bool = True,
                   memory_metric: str = "auto", desc: str | None = None, progress: bool = True,
                   label: str | None = None, ops: TransferOps | None = None) -> LoaderTrial:
    """Run ``loader`` for ``n_iters`` batches (fewer if it is shorter) and time where each iteration goes.

    Per iteration:

    * ``wait``: blocked in ``next(iterator)`` (host clock), i.e. the loader was not ready. With workers this
      is only the part of their work that did not overlap with the previous step.
    * ``copy``: ``images.to(device, non_blocking=...)`` and ``labels.to(...)``, timed with device events.
    * ``compute``: ``compute(images, labels)`` (e.g. a training step of the model), timed with device events;
      0 when ``compute`` is None (then the trial measures the loader alone).

    Two loops, because a copy can only overlap the compute when the loop lets it:

    * ``"serial"`` (pageable batches, or ``non_blocking=False``): fetch, copy, compute, then one
      synchronisation per step. A copy from pageable memory cannot run while the host goes on anyway (the
      driver stages it through a pinned buffer of its own).
    * ``"overlap"`` (the batches are pinned, ``pin_memory=True``, and ``non_blocking=True``): the copy of
      batch ``i+1`` is issued on a separate copy stream right after step ``i`` is launched, the step's stream
      waits for its batch on the GPU (``wait_stream``), and the host never waits for a copy: it synchronises
      once after iteration 0 (to keep its one-off costs out) and once at the end, where the numbers are read.
      The trial's ``overlap_s`` is, per batch, the copy time that ran while a step was computing (from the
      events' timestamps), ``copy_hidden`` its share, and the steady-state time is the host's clock up to
      that final synchronisation.

    On a CPU both loops run (the logic is the same), but there is no copy engine and no stream:
    ``.to("cpu")`` returns the tensor itself, so nothing can overlap (:func:`overlap_sentence` says so).
    ``ops``: the device calls (default :class:`TransferOps` of ``device``; tests pass a recording stand-in).

    The clock starts *before* ``iter(loader)``, which is when worker processes are started (unless
    ``persistent_workers`` kept those of a previous iterator): the first iteration's wait is the
    first-batch latency, ``first_batch_s``, and is left out of the steady-state numbers.

    Memory (``sample_memory``): after each iteration, the memory of the main process and the sum over the
    loader's worker processes (the iterator's workers and their children; every child of this process if
    the iterator does not say which). ``memory_metric``: "rss" (resident set size, ~30 us per process),
    "pss" (proportional set size) or "auto" (PSS when one reading is cheaper than 2 ms, else RSS; reading
    PSS makes the kernel walk every page, which takes milliseconds for a process that imported torch).
    RSS *double-counts* the pages a forked worker still shares with its parent (copy-on-write: the dataset,
    the imported libraries): summing RSS over workers overstates what they cost. PSS divides each shared
    page among the processes that share it, so main + workers PSS is the real footprint. The trial says
    which one it used (``memory_metric``). Sampling time is excluded from the timings (the workers keep
    working meanwhile, a small bias in their favour, negligible with RSS).

    ``desc`` is the tqdm bar's description (default: the trial's label); ``progress=False`` hides it.
    Returns a :class:`LoaderTrial`.
    """
    if isinstance(n_iters, bool) or not isinstance(n_iters, int) or n_iters < 2:
        raise ValueError(f"n_iters must be an integer >= 2 (iteration 0 is the first-batch latency, the steady "
                         f"state starts at 1), got {n_iters!r}")
    device = torch.device(device)
    ops = ops if ops is not None else TransferOps(device)
    settings = loader_settings(loader)
    label = label if label is not None else _label(settings)
    sampler = _MemorySampler(memory_metric) if sample_memory else None

    from tqdm.auto import tqdm

    bar = tqdm(total=n_iters, desc=desc if desc is not None else label, leave=False, disable=not progress)
    wait, sizes, main_mem, workers_mem = [], [], [], []
    copy_events, compute_events = [], []
    state: dict[str, Any] = {"overhead": 0.0, "workers": [], "stream": None, "mode": "serial", "pinned": None}
    steady_wall = None
    ops.synchronize()
    ref = ops.event()
    ops.record(ref)  # the origin of the device timestamps
    t_start = time.perf_counter()
    iterator = iter(loader)
    iter_s = time.perf_counter() - t_start

    def fetch(t0: float):
        """The next batch moved to the device (its copy issued), or None at the end of the loader."""
        try:
            batch = next(iterator)
        except StopIteration:
            return None
        wait.append(time.perf_counter() - t0)
        images, labels = _split_batch(batch)
        if state["pinned"] is None:  # the first batch decides how the copies are issued
            state["pinned"] = ops.is_pinned(images)
            if non_blocking and state["pinned"]:
                state["mode"], state["stream"] = "overlap", ops.new_stream()
        start, end = ops.event(), ops.event()
        with ops.on_stream(state["stream"]):
            ops.record(start, state["stream"])
            moved = ops.copy(images, non_blocking), ops.copy(labels, non_blocking)
            ops.record(end, state["stream"])
        copy_events.append((start, end))
        sizes.append(_count(images))
        return moved

    def step(moved) -> None:
        if state["stream"] is not None:  # wait for this batch's copy on the device, not on the host
            ops.wait_for(state["stream"])
            ops.hand_over(*moved)
        start, end = ops.event(), ops.event()
        ops.record(start)
        if compute is not None:
            compute(*moved)
        ops.record(end)
        compute_events.append((start, end))

    def after_step(i: int) -> None:
        if sampler is not None:
            t = time.perf_counter()
            if i == 0:
                state["workers"] = sampler.worker_processes(iterator, settings["num_workers"])
            m, w = sampler.sample(state["workers"])
            main_mem.append(m)
            workers_mem.append(w)
            state["overhead"] += time.perf_counter() - t
        bar.update(1)

    try:
        moved = fetch(t_start)
        if moved is not None:
            step(moved)
            ops.synchronize()  # end of iteration 0 (worker start, warm-ups): kept out of the steady state
            after_step(0)
        if state["mode"] == "serial":
            for i in range(1, n_iters):
                moved = fetch(time.perf_counter()) if moved is not None else None
                if moved is None:
                    break
                step(moved)
                ops.synchronize()  # one per step: the host waits until the step (and its copy) is over
                after_step(i)
        else:
            overhead0, t_steady = state["overhead"], time.perf_counter()
            moved = fetch(t_steady)  # batch 1 is copied while ...
            for i in range(1, n_iters):
                if moved is None:
                    break
                step(moved)  # ... step i computes; batch i+1's copy is issued right after its launch
                moved = fetch(time.perf_counter()) if i + 1 < n_iters else None
                after_step(i)
            ops.synchronize()  # the only wait for the device in the steady state: the numbers are read now
            steady_wall = time.perf_counter() - t_steady - (state["overhead"] - overhead0)
    finally:
        bar.close()
        del iterator  # shuts non-persistent workers down now rather than at the next garbage collection
    if not wait:
        raise ValueError("the loader produced no batch: is the dataset empty (or smaller than a batch with "
                         "drop_last=True)?")
    if len(wait) < 2:
        warnings.warn("the loader produced a single batch: no steady state to measure (throughput is NaN); "
                      "use a longer loader or smaller batches", UserWarning, stacklevel=2)
    n = len(compute_events)
    copy_iv = [(ops.seconds(ref, a), ops.seconds(ref, b)) for a, b in copy_events[:n]]
    comp_iv = [(ops.seconds(ref, a), ops.seconds(ref, b)) for a, b in compute_events]
    copy = [b - a for a, b in copy_iv]
    comp = [b - a if compute is not None else 0.0 for a, b in comp_iv]
    hidden = overlap_seconds(copy_iv, comp_iv) if compute is not None else [0.0] * n
    return LoaderTrial(settings=settings, wait_s=wait[:n], copy_s=copy, compute_s=comp, batch_sizes=sizes[:n],
                       first_batch_s=wait[0], iter_s=iter_s, main_bytes=main_mem, workers_bytes=workers_mem,
                       memory_metric=sampler.metric if sampler is not None else None,
                       memory_overhead_s=state["overhead"], device=str(device), label=label,
                       mode=state["mode"], pinned=state["pinned"], overlap_s=hidden, syncs=ops.syncs,
                       steady_wall_s=steady_wall)


def overlap_sentence(trial: LoaderTrial, baseline: LoaderTrial | None = None) -> str:
    """One sentence, from the numbers, on what ``trial`` (pinned batches, ``non_blocking=True``) showed about
    overlapping the copy with the compute; ``baseline``: the same loader without them, for the throughputs.
    On a CPU it says what such a run cannot show."""
    copy_ms = trial.median_copy_s * 1000
    if torch.device(trial.device).type != "cuda":
        return (f"On this CPU the 'copy' is .to('cpu'), which returns the tensor itself ({copy_ms:.3f} ms per batch "
                f"measured): there is no copy engine and no second stream, so there is no copy to hide and no "
                f"overlap to see; pinned memory and non_blocking only matter for copies to a GPU.")
    if trial.mode != "overlap":
        why = "the batches were not in pinned memory" if not trial.pinned else "non_blocking was False"
        return (f"No overlap was possible in {trial.label}: {why}, so every copy ({copy_ms:.2f} ms per batch) "
                f"ran before its step, one after the other.")
    out = (f"In {trial.label}, {trial.copy_hidden:.0%} of the copy time ({copy_ms:.2f} ms per batch, median) ran "
           f"while a training step was computing, with {trial.syncs} host synchronisations in {trial.n_iters} "
           f"iterations")
    if baseline is not None:
        out += (f"; throughput {trial.throughput:,.0f} img/s against {baseline.throughput:,.0f} img/s for "
                f"{baseline.label} ({baseline.mode}, {baseline.syncs} synchronisations)")
    return out + "."


def epoch_start_latency(loader, n_epochs: int = 2, *, full_epoch: bool = False) -> list[float]:
    """Seconds from ``iter(loader)`` to the first batch, for each of ``n_epochs`` epochs.

    Each ``for batch in loader`` (each epoch) calls ``iter(loader)``. Without ``persistent_workers`` that
    starts ``num_workers`` fresh processes, which must import, run ``worker_init_fn``, open files and fill
    their prefetch queues before the first batch comes: every epoch pays it again. With
    ``persistent_workers=True`` the loader keeps its iterator and workers: from the second epoch on,
    ``iter`` only tells them to start over, and the first batch comes much sooner. (Short epochs, e.g.
    validation passes, and slow worker start-up make the difference large.)

    By default each epoch stops after its first batch (what is measured); ``full_epoch=True`` runs every
    epoch to its end, as a training loop would.
    """
    if isinstance(n_epochs, bool) or not isinstance(n_epochs, int) or n_epochs < 1:
        raise ValueError(f"n_epochs must be a positive integer, got {n_epochs!r}")
    out: list[float] = []
    for _ in range(n_epochs):
        t0 = time.perf_counter()
        iterator = iter(loader)
        try:
            next(iterator)
        except StopIteration:
            raise ValueError("the loader produced no batch: is the dataset empty?") from None
        out.append(time.perf_counter() - t0)
        if full_epoch:
            for _batch in iterator:
                pass
        del iterator  # non-persistent workers are shut down here; persistent ones stay with the loader
    return out


# --------------------------------------------------------------------------------------------------------
# Choosing
# --------------------------------------------------------------------------------------------------------

def best_setting(df, tolerance: float = 0.05):
    """The setting to keep, as ``(row, reason)``: the row of ``df`` (a pandas Series) and one sentence.

    Highest throughput wins, except that any setting within ``tolerance`` (a fraction: 0.05 = 5 %) of the
    best is as good, measured on a few batches, and then the cheapest of those is kept: fewest workers,
    then least memory (``peak_total_mib``), then smallest ``prefetch_factor``. Why: every worker is a
    process that takes a CPU core and memory (its own copy of whatever it touches). The cores are shared
    with the main training process (which launches kernels, runs the optimizer, logs) and, on a multi-GPU
    node, with the other ranks, each with its own workers; a worker that buys 2 % in an isolated test
    often costs more than that once the whole node is busy.
    """
    if not 0 <= tolerance < 1:
        raise ValueError(f"tolerance must be a fraction in [0, 1), got {tolerance!r}")
    if df is None or len(df) == 0:
        raise ValueError("best_setting needs a non-empty table of trials (rows of LoaderTrial.row())")
    if "throughput" not in df.columns:
        raise ValueError("best_setting needs a 'throughput' column: build df from LoaderTrial.row()")
    valid = df[df["throughput"].notna()]
    if len(valid) == 0:
        raise ValueError("no trial has a throughput (each needs at least 2 iterations)")
    names = dict(zip(df.index, _row_labels(df)))
    best_idx = valid["throughput"].idxmax()
    best = valid.loc[best_idx]
    top = float(best["throughput"])
    close = valid[valid["throughput"] >= (1 - tolerance) * top]

    def key(item):
        idx, row = item
        mem = row.get("peak_total_mib")
        mem = float(mem) if mem is not None and not (isinstance(mem, float) and math.isnan(mem)) else math.inf
        workers = row.get("num_workers")
        prefetch = row.get("prefetch_factor")
        prefetch = 0 if prefetch is None or (isinstance(prefetch, float) and math.isnan(prefetch)) else prefetch
        return (workers if workers is not None else 0, mem, prefetch, -float(row["throughput"]))

    idx, chosen = min(close.iterrows(), key=key)
    thr = float(chosen["throughput"])

    def mem(row) -> str:
        v = row.get("peak_total_mib")
        return "" if v is None or (isinstance(v, float) and math.isnan(v)) else f", {float(v):.0f} MiB"

    if idx == best_idx:
        others = len(close) - 1
        reason = (f"{names[idx]} is the fastest ({thr:,.0f} img/s{mem(chosen)}, waiting "
                  f"{float(chosen.get('wait_fraction', math.nan)):.0%} of the time) and "
                  + (f"none of the {others} other settings within {tolerance:.0%} of it is cheaper"
                     if others else f"no other setting comes within {tolerance:.0%} of it"))
    else:
        reason = (f"{names[idx]} ({thr:,.0f} img/s{mem(chosen)}, {chosen.get('num_workers')} workers) is within "
                  f"{tolerance:.0%} of the fastest, {names[best_idx]} ({top:,.0f} img/s{mem(best)}, "
                  f"{best.get('num_workers')} workers), at a lower cost: keep it and leave the spare cores "
                  f"and memory to the training process and the other ranks")
    return chosen, reason


def core_budget(nproc_per_node: int = 1) -> dict[str, Any]:
    """How many loader workers each training process (rank) of this node can afford.

    * ``available``: cores this process may run on (its affinity mask, :func:`dlo.data.loaders.available_cores`):
      what Slurm (``--cpus-per-task``), ``taskset`` or a container actually grants, unlike ``cpu_count``,
      the machine's total.
    * ``slurm_cpus_per_task``: ``$SLURM_CPUS_PER_TASK`` if set. When it is smaller than the affinity mask
      (a cluster that does not bind tasks to cores) it is the budget: using more steals cores from jobs
      beside yours.
    * ``max_workers_per_rank = max(0, cores // nproc_per_node - 1)``: the cores are split between the
      ranks of this node, and each rank keeps one core for its own training loop (Python, kernel launches,
      optimizer step): workers beyond that compete with the process they feed.

    ``nproc_per_node``: ranks sharing *these* cores. Launched by ``srun`` with one task per GPU, each
    process has its own cores: 1. One task running ``torchrun --nproc-per-node=N``: N.
    """
    if isinstance(nproc_per_node, bool) or not isinstance(nproc_per_node, int) or nproc_per_node < 1:
        raise ValueError(f"nproc_per_node must be a positive integer, got {nproc_per_node!r}")
    available = data.available_cores()
    raw = os.environ.get("SLURM_CPUS_PER_TASK")
    try:
        slurm = int(raw) if raw else None
    except ValueError:
        slurm = None
    if slurm is not None and slurm < 1:
        slurm = None
    cores = min(available, slurm) if slurm is not None else available
    per_rank = cores // nproc_per_node
    workers = max(0, per_rank - 1)
    source = (f"SLURM_CPUS_PER_TASK={slurm}" if slurm is not None and slurm < available
              else f"{available} cores in this process's affinity mask")
    explanation = (f"{cores} cores ({source}) shared by {nproc_per_node} rank(s): {per_rank} per rank, one kept for "
                   f"the training process itself, so at most {workers} loader worker(s) per rank"
                   + ("; below 2 cores per rank, load in the main process (num_workers=0)" if workers == 0 else ""))
    return {
        "available": available,
        "slurm_cpus_per_task": slurm,
        "cpu_count": os.cpu_count(),
        "nproc_per_node": nproc_per_node,
        "cores": cores,
        "cores_per_rank": per_rank,
        "max_workers_per_rank": workers,
        "explanation": explanation,
    }


def shm_status(path: str | os.PathLike | None = None) -> dict[str, Any]:
    """Size and free space of the shared-memory filesystem (``/dev/shm``), and torch's sharing strategy.

    Worker processes do not hand batches to the main process by pickling them through a pipe: each batch's
    tensors are put in shared memory and only a handle travels. With the default strategy
    ("file_descriptor") that memory lives in ``/dev/shm``, and up to ``num_workers x prefetch_factor``
    batches are in flight at once (e.g. 8 workers x 2 x a batch of 256 images 3 x 224 x 224 in float32,
    154 MiB each, is about 2.4 GiB). Docker gives containers a 64 MiB ``/dev/shm`` by default: the loader
    then dies with ``Bus error`` or ``RuntimeError: unable to write to file </torch_...>`` (or "No space
    left on device"), often only with workers and big batches. Fixes, best first:

    * give the container more shared memory: ``docker run --shm-size=8g`` (or ``--ipc=host``); on
      Kubernetes mount an ``emptyDir`` with ``medium: Memory`` on ``/dev/shm``;
    * fewer batches in flight: fewer workers, smaller ``prefetch_factor``, smaller batches (or uint8
      images converted to float on the device);
    * ``torch.multiprocessing.set_sharing_strategy('file_system')``: shared files named in ``/dev/shm``
      kept open by name instead of file descriptors (helps with "too many open files"; can leak files if
      a process is killed, and still needs space).

    Returns ``path, exists, total_bytes, free_bytes, total_mib, free_mib`` (None when the path is missing),
    ``sharing_strategy``, ``sharing_strategies`` (all this platform has) and a one-line ``advice``.
    ``path`` defaults to :data:`SHM_PATH`.
    """
    shm = Path(path) if path is not None else SHM_PATH
    total = free = None
    exists = shm.exists()
    if exists:
        try:
            usage = shutil.disk_usage(shm)
            total, free = int(usage.total), int(usage.free)
        except OSError:
            pass
    try:
        import torch.multiprocessing as tmp

        strategy = tmp.get_sharing_strategy()
        strategies = sorted(tmp.get_all_sharing_strategies())
    except Exception:  # noqa: BLE001 - platforms without torch.multiprocessing sharing
        strategy, strategies = None, []
    if not exists:
        advice = (f"{shm} does not exist: workers' batches go through the sharing strategy's other storage; "
                  f"if workers crash, try num_workers=0 to confirm")
    elif total is None:
        advice = f"could not read the size of {shm}"
    elif total < 512 * _MiB:
        advice = (f"{shm} holds only {total / _MiB:.0f} MiB (a container default?): loader workers may die with "
                  f"'Bus error'; raise it (docker --shm-size / --ipc=host) or keep num_workers x prefetch_factor "
                  f"x batch bytes well below {free / _MiB:.0f} MiB free")
    else:
        advice = (f"{shm}: {free / _MiB:,.0f} MiB free of {total / _MiB:,.0f} MiB; in-flight batches "
                  f"(num_workers x prefetch_factor x batch bytes) must fit there")
    return {
        "path": str(shm),
        "exists": exists,
        "total_bytes": total,
        "free_bytes": free,
        "total_mib": None if total is None else total / _MiB,
        "free_mib": None if free is None else free / _MiB,
        "sharing_strategy": strategy,
        "sharing_strategies": strategies,
        "advice": advice,
    }



def _row_labels(df) -> list[str]:
    """``label`` column if present, else built from the settings that differ between rows."""
    if "label" in df.columns and df["label"].notna().all():
        return [str(v) for v in df["label"]]
    varying = [k for k in LOADER_KNOBS if k in df.columns and df[k].astype(str).nunique() > 1] or \
              [k for k in ("num_workers",) if k in df.columns]
    return [", ".join(f"{k}={row[k]}" for k in varying) or str(i) for i, (_, row) in enumerate(df.iterrows())]
