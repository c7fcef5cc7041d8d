"""Running a DataLoader trial: :func:`profile_loader` (with the device calls behind :class:`TransferOps`, so
the loop that overlaps copy and compute runs unchanged on a CPU), :func:`overlap_sentence`, and
:func:`epoch_start_latency`."""
from __future__ import annotations

import contextlib
import time
import warnings
from typing import Any, Callable

import torch

from dlo.runtime.device import synchronize


from dlo.lessons.loader.trial import LoaderTrial, MemorySampler, loader_settings, trial_label


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
    run = _LoaderRun(loader, device=device, compute=compute, non_blocking=non_blocking,
                     ops=ops if ops is not None else TransferOps(device),
                     sampler=MemorySampler(memory_metric) if sample_memory else None)
    label = label if label is not None else trial_label(run.settings)
    from tqdm.auto import tqdm

    run.bar = tqdm(total=n_iters, desc=desc if desc is not None else label, leave=False, disable=not progress)
    run.start()
    try:
        run.first_iteration()
        if run.mode == "serial":
            run.serial_loop(n_iters)
        else:
            run.overlap_loop(n_iters)
    finally:
        run.bar.close()
        run.iterator = None  # shuts non-persistent workers down now rather than at the next garbage collection
    return run.trial(label)


class _LoaderRun:
    """The phases of :func:`profile_loader`: start the iterator, run iteration 0, then the steady state in the
    serial or the overlapping loop, and turn the recorded events into a :class:`LoaderTrial`."""

    def __init__(self, loader, *, device: torch.device, compute, non_blocking: bool, ops: TransferOps,
                 sampler: MemorySampler | None) -> None:
        self.loader, self.device, self.compute, self.non_blocking = loader, device, compute, non_blocking
        self.ops, self.sampler = ops, sampler
        self.settings = loader_settings(loader)
        self.bar: Any = None
        self.wait: list[float] = []
        self.sizes: list[int] = []
        self.main_mem: list[int] = []
        self.workers_mem: list[int] = []
        self.copy_events: list[tuple[Any, Any]] = []
        self.compute_events: list[tuple[Any, Any]] = []
        self.overhead, self.workers, self.stream, self.mode, self.pinned = 0.0, [], None, "serial", None
        self.steady_wall: float | None = None
        self.moved: Any = None

    def start(self) -> None:
        """The clock starts before ``iter(loader)``: starting the workers is part of the first-batch latency."""
        self.ops.synchronize()
        self.ref = self.ops.event()
        self.ops.record(self.ref)  # the origin of the device timestamps
        self.t_start = time.perf_counter()
        self.iterator = iter(self.loader)
        self.iter_s = time.perf_counter() - self.t_start

    def fetch(self, t0: float):
        """The next batch moved to the device (its copy issued), or None at the end of the loader."""
        ops = self.ops
        try:
            batch = next(self.iterator)
        except StopIteration:
            return None
        self.wait.append(time.perf_counter() - t0)
        images, labels = _split_batch(batch)
        if self.pinned is None:  # the first batch decides how the copies are issued
            self.pinned = ops.is_pinned(images)
            if self.non_blocking and self.pinned:
                self.mode, self.stream = "overlap", ops.new_stream()
        start, end = ops.event(), ops.event()
        with ops.on_stream(self.stream):
            ops.record(start, self.stream)
            moved = ops.copy(images, self.non_blocking), ops.copy(labels, self.non_blocking)
            ops.record(end, self.stream)
        self.copy_events.append((start, end))
        self.sizes.append(_count(images))
        return moved

    def step(self, moved) -> None:
        ops = self.ops
        if self.stream is not None:  # wait for this batch's copy on the device, not on the host
            ops.wait_for(self.stream)
            ops.hand_over(*moved)
        start, end = ops.event(), ops.event()
        ops.record(start)
        if self.compute is not None:
            self.compute(*moved)
        ops.record(end)
        self.compute_events.append((start, end))

    def after_step(self, i: int) -> None:
        if self.sampler is not None:
            t = time.perf_counter()
            if i == 0:
                self.workers = self.sampler.worker_processes(self.iterator, self.settings["num_workers"])
            m, w = self.sampler.sample(self.workers)
            self.main_mem.append(m)
            self.workers_mem.append(w)
            self.overhead += time.perf_counter() - t
        self.bar.update(1)

    def first_iteration(self) -> None:
        self.moved = self.fetch(self.t_start)
        if self.moved is not None:
            self.step(self.moved)
            self.ops.synchronize()  # end of iteration 0 (worker start, warm-ups): kept out of the steady state
            self.after_step(0)

    def serial_loop(self, n_iters: int) -> None:
        """Fetch, copy, compute, then one synchronisation per step."""
        moved = self.moved
        for i in range(1, n_iters):
            moved = self.fetch(time.perf_counter()) if moved is not None else None
            if moved is None:
                break
            self.step(moved)
            self.ops.synchronize()  # one per step: the host waits until the step (and its copy) is over
            self.after_step(i)

    def overlap_loop(self, n_iters: int) -> None:
        """Batch i+1's copy is issued right after step i is launched; one synchronisation at the end."""
        overhead0, t_steady = self.overhead, time.perf_counter()
        moved = self.fetch(t_steady)  # batch 1 is copied while ...
        for i in range(1, n_iters):
            if moved is None:
                break
            self.step(moved)  # ... step i computes; batch i+1's copy is issued right after its launch
            moved = self.fetch(time.perf_counter()) if i + 1 < n_iters else None
            self.after_step(i)
        self.ops.synchronize()  # the only wait for the device in the steady state: the numbers are read now
        self.steady_wall = time.perf_counter() - t_steady - (self.overhead - overhead0)

    def trial(self, label: str) -> LoaderTrial:
        """The recorded events read as seconds (after the final synchronisation)."""
        ops, wait = self.ops, self.wait
        if not wait:
            raise ValueError("the loader produced no batch: is the dataset empty (or smaller than a batch with "
                             "drop_last=True)?")
        if len(wait) < 2:
            warnings.warn("the loader produced a single batch: no steady state to measure (throughput is NaN); "
                          "use a longer loader or smaller batches", UserWarning, stacklevel=3)
        n = len(self.compute_events)
        copy_iv = [(ops.seconds(self.ref, a), ops.seconds(self.ref, b)) for a, b in self.copy_events[:n]]
        comp_iv = [(ops.seconds(self.ref, a), ops.seconds(self.ref, b)) for a, b in self.compute_events]
        copy = [b - a for a, b in copy_iv]
        comp = [b - a if self.compute is not None else 0.0 for a, b in comp_iv]
        hidden = overlap_seconds(copy_iv, comp_iv) if self.compute is not None else [0.0] * n
        return LoaderTrial(settings=self.settings, wait_s=wait[:n], copy_s=copy, compute_s=comp,
                           batch_sizes=self.sizes[:n], first_batch_s=wait[0], iter_s=self.iter_s,
                           main_bytes=self.main_mem, workers_bytes=self.workers_mem,
                           memory_metric=self.sampler.metric if self.sampler is not None else None,
                           memory_overhead_s=self.overhead, device=str(self.device), label=label,
                           mode=self.mode, pinned=self.pinned, overlap_s=hidden, syncs=ops.syncs,
                           steady_wall_s=self.steady_wall)


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
