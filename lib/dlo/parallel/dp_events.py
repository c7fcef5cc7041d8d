"""A timeline of one rank's training step: compute spans and every all-reduce, from launch to completion.

Data parallelism is fast when the gradients' all-reduces run *while* backward still computes. To see it,
each rank records timestamps:

* :meth:`Timeline.span` around a piece of compute (``forward``, ``backward``, ``wait``, ``optimizer``);
* :func:`record_collectives`, a context manager that wraps ``torch.distributed.all_reduce`` while it is
  active, so that every all-reduce the code under it launches (from a hook, from DDP's Python comm hook,
  from a plain loop) is recorded without changing that code: launch time, completion time, size, whether
  it was asynchronous, which compute span was open at its launch, and whether its handle was waited on.
  With ``defer=True`` (what the course's checkers use) an asynchronous all-reduce's result only reaches
  its tensor when its handle is waited for, as a real backend guarantees nothing before: a handle never
  waited for leaves the tensor as it was, and the wait itself is an event (which compute span it came in,
  and what happened between launch and wait).

Every event carries ``seq``, its place in the order of everything the timeline recorded (spans' starts and
ends, launches, waits): the order, unlike the clock, does not depend on the machine's load.

Where the time comes from is kept behind two small functions, :func:`new_marker` and :func:`elapsed_s`:
on the CPU a marker is ``time.perf_counter()``; on a GPU it is a CUDA event recorded in the current stream
(kernels are queued: the host clock would time the queueing, not the work), read once the step is over.
A collective's completion is marked in its future's callback, which runs after the collective (on the
CPU in gloo's thread; on a GPU in stream order).

:func:`comm_gantt` draws one row per rank and lane from the events of several ranks.
"""
from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist

from dlo.measure.bench import make_timer


# ----------------------------------------------------------------------------------------------------
# Markers: the only device-specific calls
# ----------------------------------------------------------------------------------------------------
def new_marker(device: torch.device | str | None = None) -> Any:
    """A point in time on ``device``: a CUDA event recorded in the current stream, else ``perf_counter()``."""
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type == "cuda":
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event
    return time.perf_counter()


def elapsed_s(start: Any, end: Any) -> float:
    """Seconds from marker ``start`` to marker ``end`` (waits for CUDA events to complete)."""
    if isinstance(start, float) and isinstance(end, float):
        return end - start
    end.synchronize()
    return start.elapsed_time(end) / 1000.0


# ----------------------------------------------------------------------------------------------------
# The timeline of one rank
# ----------------------------------------------------------------------------------------------------
class Timeline:
    """Spans of one rank, with markers resolved into seconds since :meth:`start` when :attr:`events` is read.

    Each event is a dict: ``lane`` ("compute" or "comm"), ``name``, ``step``, ``start_s``, ``end_s`` and,
    for collectives, ``bytes``, ``numel``, ``async_op``, ``during`` (the compute span open at launch, or
    None) and ``waited`` (whether ``wait()`` was called on its handle). ``seq`` orders the events (a span's
    start; ``end_seq`` its end); a collective's ``wait_seq`` and ``wait_during`` say when it was waited for
    and which span was open then (a blocking call is waited for at its launch).
    """

    def __init__(self, device: torch.device | str | None = None, rank: int = 0) -> None:
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.rank = rank
        self.step = 0
        self.open_span: str | None = None  # the compute span running now (read by the collective recorder)
        self._origin: Any = None
        self._raw: list[dict] = []
        self._lock = threading.Lock()
        self._seq = itertools.count()

    def next_seq(self) -> int:
        """The next place in the order of recorded events."""
        with self._lock:
            return next(self._seq)

    def start(self, step: int | None = None) -> None:
        """Set time zero (call it on every rank right after a barrier, so the ranks' times line up)."""
        if step is not None:
            self.step = step
        self._origin = new_marker(self.device)

    def mark(self) -> Any:
        if self._origin is None:
            self.start()
        return new_marker(self.device)

    @contextlib.contextmanager
    def span(self, name: str) -> Iterator[None]:
        """Record the compute between entering and leaving the block as one event named ``name``."""
        start, seq = self.mark(), self.next_seq()
        previous, self.open_span = self.open_span, name
        try:
            yield
        finally:
            self.open_span = previous
            self.add("compute", name, start, new_marker(self.device), seq=seq, end_seq=self.next_seq())

    def add(self, lane: str, name: str, start: Any, end: Any = None, **meta: Any) -> dict:
        raw = {"lane": lane, "name": name, "step": self.step, "_start": start, "_end": end, **meta}
        with self._lock:
            self._raw.append(raw)
        return raw

    def clear(self) -> None:
        with self._lock:
            self._raw.clear()

    @property
    def events(self) -> list[dict]:
        """Every event with ``start_s`` / ``end_s`` in seconds since :meth:`start` (None: not finished)."""
        with self._lock:
            raws = list(self._raw)
        out = []
        for raw in raws:
            event = {k: v for k, v in raw.items() if not k.startswith("_")}
            event["start_s"] = elapsed_s(self._origin, raw["_start"])
            event["end_s"] = elapsed_s(self._origin, raw["_end"]) if raw["_end"] is not None else None
            out.append(event)
        return out

    def collectives(self) -> list[dict]:
        return [e for e in self.events if e["lane"] == "comm"]


class _RecordedWork:
    """The handle of a recorded asynchronous collective: the real one, plus when it was waited on."""

    def __init__(self, work: Any, raw: dict, timeline: Timeline) -> None:
        self._work, self._raw, self._timeline = work, raw, timeline

    def _mark_waited(self) -> None:
        if self._raw["wait_seq"] is None:
            self._raw["waited"] = True
            self._raw["wait_seq"] = self._timeline.next_seq()
            self._raw["wait_during"] = self._timeline.open_span

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        self._mark_waited()
        return self._work.wait(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:  # is_completed, get_future, result, ...
        return getattr(self._work, name)


class _DeferredWork(_RecordedWork):
    """The handle of a deferred all-reduce: the collective runs on a copy of the tensor, and the result is
    copied into the tensor itself when the handle is waited for. Until then the handle is not completed."""

    def __init__(self, work: Any, raw: dict, timeline: Timeline, tensor: torch.Tensor, copy: torch.Tensor) -> None:
        super().__init__(work, raw, timeline)
        self._tensor, self._copy, self._applied = tensor, copy, False

    def _apply(self) -> None:
        if not self._applied:
            self._applied = True
            self._tensor.copy_(self._copy)

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        self._mark_waited()
        out = self._work.wait(*args, **kwargs)
        self._apply()
        return out

    def is_completed(self) -> bool:
        return self._applied

    def get_future(self) -> Any:
        """A future of the result, which lands in the tensor when the collective completes (whoever waits on a
        future counts as waiting for the handle)."""
        def land(fut: Any) -> list[torch.Tensor]:
            fut.value()
            self._mark_waited()
            self._apply()
            return [self._tensor]

        return self._work.get_future().then(land)


@contextlib.contextmanager
def record_collectives(timeline: Timeline, *, defer: bool = False) -> Iterator[Timeline]:
    """Inside the block, every ``torch.distributed.all_reduce`` call becomes a "comm" event of ``timeline``.

    The call itself is unchanged (same tensor, op, group, async or not); it is only timed. With ``defer``,
    an asynchronous all-reduce reduces a copy of its tensor and writes the result into the tensor only when
    its handle is waited for (see the module docstring). Code that imported the function under another name
    (``from torch.distributed import all_reduce``) is not seen.
    """
    real = dist.all_reduce

    def recorded(tensor: torch.Tensor, *args: Any, async_op: bool = False, **kwargs: Any) -> Any:
        if len(args) >= 3:  # all_reduce(tensor, op, group, async_op) called positionally
            args, async_op = args[:2], bool(args[2])
        seq = timeline.next_seq()
        raw = timeline.add("comm", "all_reduce", timeline.mark(), None, bytes=tensor.numel() * tensor.element_size(),
                           numel=tensor.numel(), async_op=bool(async_op), during=timeline.open_span,
                           waited=not async_op, seq=seq, wait_seq=None if async_op else seq,
                           wait_during=None if async_op else timeline.open_span)
        if not async_op:
            out = real(tensor, *args, async_op=False, **kwargs)
            raw["_end"] = new_marker(timeline.device)
            return out
        target = tensor.detach().clone() if defer else tensor
        work = real(target, *args, async_op=True, **kwargs)

        def done(fut: Any) -> Any:
            raw["_end"] = new_marker(timeline.device)  # runs after the collective (gloo thread / stream order)
            return fut.value()

        work.get_future().then(done)
        if defer:
            return _DeferredWork(work, raw, timeline, tensor, target)
        return _RecordedWork(work, raw, timeline)

    dist.all_reduce = recorded
    try:
        yield timeline
    finally:
        dist.all_reduce = real


def agreed_timer(device: torch.device | str | None = None, group: Any = None) -> Callable[[Callable[[], Any]], float]:
    """A timer for :mod:`dlo.measure.bench` in a distributed run: times one call on this rank (CUDA events on a
    GPU), then every rank takes the *slowest* rank's time (an all-reduce MAX, outside the timed part).

    A data-parallel step is as slow as its slowest rank, and with identical numbers every rank takes the
    same warm-up decisions (until steady): the ranks run the same number of calls, which they must, since
    every call communicates.
    """
    base = make_timer(device)
    dev = torch.device(device) if device is not None else torch.device("cpu")

    def timer(fn: Callable[[], Any]) -> float:
        seconds = torch.tensor([float(base(fn))], dtype=torch.float64, device=dev)
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(seconds, op=dist.ReduceOp.MAX, group=group)
        return float(seconds.item())

    return timer


# ----------------------------------------------------------------------------------------------------
# Reading several ranks' events
# ----------------------------------------------------------------------------------------------------
def comm_window_s(events: Sequence[dict], backward: str = "backward") -> dict[str, float]:
    """One step's communication, split into what backward hid and what it left exposed, in seconds.

    ``comm_s`` is the communication window, from the first all-reduce's launch to the last one's completion;
    ``hidden_s`` the part of it inside the backward span (the computation went on meanwhile); ``exposed_s`` the
    part after backward ended, which the step waits for. Each lies in ``[0, comm_s]`` whatever the order of the
    events: all-reduces that start after backward ends (naive) hide nothing and expose only their own window, not
    the time before their launch; all-reduces that end inside backward expose nothing. Without a recorded backward
    span nothing is counted as hidden or exposed."""
    comms = [(e["start_s"], e["end_s"]) for e in events if e["lane"] == "comm" and e["end_s"] is not None]
    bwd = [(e["start_s"], e["end_s"]) for e in events
           if e["lane"] == "compute" and e["name"] == backward and e["end_s"] is not None]
    if not comms:
        return {"comm_s": 0.0, "hidden_s": 0.0, "exposed_s": 0.0}
    first, last = min(s for s, _ in comms), max(e for _, e in comms)
    total = max(0.0, last - first)
    if not bwd:
        return {"comm_s": total, "hidden_s": 0.0, "exposed_s": 0.0}
    b_start, b_end = max(bwd, key=lambda span: span[1])  # the step's (last) backward

    def within(x: float) -> float:
        return min(max(0.0, x), total)

    return {"comm_s": total, "hidden_s": within(min(last, b_end) - max(first, b_start)),
            "exposed_s": within(last - max(first, b_end))}


def exposed_comm_s(events: Sequence[dict], backward: str = "backward") -> float:
    """Communication time not hidden behind ``backward``: from the end of the backward span (or the first
    all-reduce's launch, when it comes later) to the completion of the last all-reduce of the same step; 0 when
    every all-reduce finished during backward, never more than the communication window (:func:`comm_window_s`)."""
    return comm_window_s(events, backward)["exposed_s"]


_COLORS = {"forward": "#4c72b0", "backward": "#55a868", "wait": "#c44e52", "optimizer": "#8172b2",
           "all_reduce": "#dd8452"}


def comm_gantt(per_rank: Sequence[Sequence[dict]], *, title: str = "", ax=None, path=None):
    """One pair of rows per rank: compute spans (forward, backward, waiting, optimizer) and, below, every
    all-reduce from launch to completion (stacked when several are in flight). Returns the figure."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(10, 1.1 * len(per_rank) + 1.0))
    ticks, labels = [], []
    for r, events in enumerate(per_rank):
        base = r * 2.4
        for e in events:
            if e["lane"] != "compute" or e["end_s"] is None:
                continue
            ax.barh(base, (e["end_s"] - e["start_s"]) * 1e3, left=e["start_s"] * 1e3, height=0.8,
                    color=_COLORS.get(e["name"], "grey"), edgecolor="white")
        comms = sorted((e for e in events if e["lane"] == "comm" and e["end_s"] is not None), key=lambda e: e["start_s"])
        ends: list[float] = []  # sub-row k is free after ends[k]
        for e in comms:
            row = next((k for k, end in enumerate(ends) if end <= e["start_s"]), None)
            if row is None:
                ends.append(e["end_s"])
                row = len(ends) - 1
            else:
                ends[row] = e["end_s"]
            height = 0.8 / max(1, min(4, len(comms)))
            y = base + 1.0 + (row % 4) * height
            ax.barh(y, (e["end_s"] - e["start_s"]) * 1e3, left=e["start_s"] * 1e3, height=height * 0.9,
                    color=_COLORS["all_reduce"], edgecolor="#8a4b1d", linewidth=0.5, alpha=0.85)
        ticks += [base, base + 1.3]
        labels += [f"rank {r} compute", f"rank {r} all-reduce"]
    ax.set_yticks(ticks, labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms since the step began")
    ax.set_title(title, fontsize=10)
    ax.legend(handles=[Patch(color=c, label=n.replace("_", "-")) for n, c in _COLORS.items()],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig = fig or ax.figure
    if path is not None:
        fig.savefig(path, dpi=120, bbox_inches="tight")
    return fig


__all__ = ["new_marker", "elapsed_s", "Timeline", "record_collectives", "agreed_timer", "comm_window_s", "exposed_comm_s", "comm_gantt"]
