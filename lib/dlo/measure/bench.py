"""Honest timing: synchronised, warmed up until steady, repeated, interleaved; median and spread reported.

Why each rule matters:
- GPU work is asynchronous: Python returns as soon as kernels are *queued*. Timing without a
  synchronisation measures the queueing, not the work. On CUDA we time with CUDA events (recorded in the
  stream, read after a synchronize); on CPU, ``time.perf_counter`` around a synchronised call.
- The first calls pay one-off costs (cuDNN autotuning, torch.compile, oneDNN kernel creation, allocator
  growth, lazy inits), and nobody knows in advance for how many calls: on a 2-core CPU a ResNet-18 step
  took about 3 s for its first four calls, then 0.3 s. So the warm-up (:class:`Warmup`) goes on until the
  last few calls agree with each other, with a cap on calls and seconds, and every measurement records
  whether it got there (``steady``).
- A single measurement is noisy (other processes, clocks, the OS): we repeat, report the median (which,
  unlike the mean, ignores the odd slow outlier) *and* the spread, the interquartile range [q25, q75] of
  the repeats. A difference smaller than that spread is not a difference.
- The machine drifts during a run (another job starts, the CPU heats up and slows down). Configurations
  that are compared are therefore timed *interleaved*, A B A B ... (:func:`measure_interleaved`), never
  AAAAA then BBBBB: a drift then hits all of them alike.
- A ratio is reported only when both measurements are steady (:func:`unsteady_reason`); otherwise the
  helpers say why instead of printing a number.

Every measurement becomes a plain dict ("record") that can be written to JSON and collected in a
pandas table, so numbers shown in a notebook come from the run that shows them. What the numbers allow
one to say (faster beyond the noise or not, the sentences, the ladder's keep rule) is :mod:`dlo.measure.verdicts`.
"""
from __future__ import annotations

import math
import statistics
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch
from dlo.runtime.device import synchronize
from dlo.measure.decide import MAX_SPREAD as _MAX_SPREAD, looks, pair_decider

#: A timer runs ``fn`` once and returns how long it took, in seconds (see :func:`make_timer`). Tests pass
#: their own (a fake clock), so that what they check never depends on the speed of the machine.
Timer = Callable[[Callable[[], Any]], float]

#: The widest spread of the timed repeats, as interquartile range / median, for which a ratio is still
#: reported (defined with the decision rule, :mod:`dlo.measure.decide`).
MAX_SPREAD = _MAX_SPREAD


def make_timer(device: torch.device | str | None = None) -> Timer:
    """The timer for ``device``: CUDA events on a GPU (recorded in the stream, read after a synchronize),
    elsewhere ``perf_counter`` between two synchronisations."""
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type == "cuda":
        def cuda_timer(fn: Callable[[], Any]) -> float:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1000.0
        return cuda_timer

    def host_timer(fn: Callable[[], Any]) -> float:
        synchronize(dev)
        t0 = time.perf_counter()
        fn()
        synchronize(dev)
        return time.perf_counter() - t0
    return host_timer


@dataclass(frozen=True)
class Warmup:
    """Warm up until steady: call ``fn`` until the last ``window`` calls agree, that is
    ``max - min <= tolerance x median`` over those calls, after at least ``min_calls`` calls. Stop anyway
    after ``max_calls`` calls, or once the warm-up calls add up to ``max_seconds`` (their measured time):
    the measurement is then marked ``steady=False`` and no ratio is reported from it.

    The defaults (3 calls within 10 %) catch one-off costs, which make a call several times slower than
    a normal one, while tolerating the ordinary jitter of a shared machine.
    """

    min_calls: int = 1
    window: int = 3
    tolerance: float = 0.10
    max_calls: int = 30
    max_seconds: float = 60.0

    def __post_init__(self) -> None:
        if not (isinstance(self.min_calls, int) and self.min_calls >= 0):
            raise ValueError(f"Warmup: min_calls must be an integer >= 0, got {self.min_calls!r}")
        if not (isinstance(self.window, int) and self.window >= 2):
            raise ValueError(f"Warmup: window must be an integer >= 2 (calls compared), got {self.window!r}")
        if not (self.tolerance > 0):
            raise ValueError(f"Warmup: tolerance must be > 0 (0.1 = 10 %), got {self.tolerance!r}")
        if not (isinstance(self.max_calls, int) and self.max_calls >= max(self.min_calls, self.window)):
            raise ValueError(f"Warmup: max_calls must be an integer >= min_calls and window, got {self.max_calls!r}")
        if not (self.max_seconds > 0):
            raise ValueError(f"Warmup: max_seconds must be > 0, got {self.max_seconds!r}")

    def settled(self, times: Sequence[float]) -> bool:
        """Whether the last ``window`` of ``times`` agree within ``tolerance`` (and ``min_calls`` were run)."""
        if len(times) < max(self.min_calls, self.window):
            return False
        last = list(times)[-self.window:]
        return max(last) - min(last) <= self.tolerance * statistics.median(last)


def _check_counts(warmup: Warmup | int, repeats: int, max_repeats: int | None = None) -> None:
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if max_repeats is not None and (not isinstance(max_repeats, int) or isinstance(max_repeats, bool)
                                    or max_repeats < repeats):
        raise ValueError(f"max_repeats must be an integer >= repeats ({repeats}), got {max_repeats!r}")
    if not isinstance(warmup, Warmup) and (not isinstance(warmup, int) or warmup < 0):
        raise ValueError(f"warmup must be >= 0 (a number of calls) or a Warmup policy, got {warmup}")


class _WarmingUp:
    """The warm-up of one candidate, one call at a time (so that several can be driven in turn)."""

    def __init__(self, warmup: Warmup | int) -> None:
        self.policy = warmup
        self.times: list[float] = []

    @property
    def done(self) -> bool:
        if not isinstance(self.policy, Warmup):
            return len(self.times) >= self.policy
        p = self.policy
        return p.settled(self.times) or len(self.times) >= p.max_calls or sum(self.times) >= p.max_seconds

    @property
    def steady(self) -> bool | None:
        """True / False for a policy; None for a fixed number of calls (not checked)."""
        return self.policy.settled(self.times) if isinstance(self.policy, Warmup) else None


def warm_up(fn: Callable[[], Any], warmup: Warmup | int = Warmup(), *, timer: Timer | None = None,
            device: torch.device | str | None = None) -> tuple[list[float], bool | None]:
    """Run the warm-up calls of ``fn``. Returns their durations (seconds) and whether the timings became
    steady: True or False with a :class:`Warmup` policy, None for a fixed number of calls (not checked)."""
    _check_counts(warmup, 1)
    timer = timer or make_timer(device)
    state = _WarmingUp(warmup)
    while not state.done:
        state.times.append(float(timer(fn)))
    return state.times, state.steady


def time_calls(fn: Callable[[], Any], *, warmup: Warmup | int = 1, repeats: int = 5,
               device: torch.device | str | None = None, progress: str | None = None,
               timer: Timer | None = None) -> list[float]:
    """Warm ``fn`` up (``warmup`` calls, or until steady with a :class:`Warmup` policy), then run it
    ``repeats`` times timed. Returns seconds per timed call.

    On CUDA each call is bracketed by CUDA events; elsewhere by ``perf_counter`` after a synchronize.
    ``progress`` shows a tqdm bar with that description; ``timer`` replaces the clock (tests).
    """
    m = measure(progress if isinstance(progress, str) and progress else "calls", fn, items_per_call=1,
                warmup=warmup, repeats=repeats,
                device=device if device is not None else "cpu", track_memory=False, progress=bool(progress),
                timer=timer)
    return m.times_s


class PeakMemory:
    """Peak memory while the ``with`` block runs.

    CUDA: ``torch.cuda.max_memory_allocated`` after a reset (memory held by tensors; the caching
    allocator reserves a bit more). CPU: the process's resident set size (RSS) sampled every few
    milliseconds by a background thread: the whole process, Python included, so compare
    configurations with each other rather than reading it as the model's footprint.
    """

    def __init__(self, device: torch.device | str = "cpu", interval_s: float = 0.005) -> None:
        self.device = torch.device(device)
        self.interval_s = interval_s
        self.peak_bytes = 0
        self.kind = "cuda_max_allocated" if self.device.type == "cuda" else "cpu_rss_peak"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "PeakMemory":
        if self.device.type == "cuda":
            synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            import psutil

            proc = psutil.Process()
            self.peak_bytes = proc.memory_info().rss

            def sample() -> None:
                while not self._stop.is_set():
                    self.peak_bytes = max(self.peak_bytes, proc.memory_info().rss)
                    self._stop.wait(self.interval_s)

            self._thread = threading.Thread(target=sample, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device.type == "cuda":
            synchronize(self.device)
            self.peak_bytes = int(torch.cuda.max_memory_allocated(self.device))
        else:
            self._stop.set()
            if self._thread is not None:
                self._thread.join()


def format_number(v: float) -> str:
    """A throughput for a sentence: 3 significant digits, thousands separated (1,234 / 53.8 / 0.512)."""
    if not math.isfinite(v):
        return str(v)
    if abs(v) >= 100:
        return f"{v:,.0f}"
    return f"{float(f'{v:.3g}'):g}"


def quartiles(times: Sequence[float]) -> tuple[float, float]:
    """(q25, q75) of ``times``, linear interpolation between the sorted values (``method="inclusive"``)."""
    if len(times) == 1:
        return float(times[0]), float(times[0])
    q25, _, q75 = statistics.quantiles(times, n=4, method="inclusive")
    return q25, q75


@dataclass
class Measurement:
    """One timed configuration. ``throughput`` is ``items_per_call / median_s`` (e.g. images/s).

    The noise band is the interquartile range of the timed repeats: ``q25_s``..``q75_s`` seconds per call,
    i.e. ``throughput_low``..``throughput_high``; ``spread`` is that range over the median. ``warmup`` is
    the number of warm-up calls run (their times in ``warmup_times_s``), ``steady`` whether they reached
    steady timings (None: a fixed number of warm-up calls, not checked). ``min_repeats`` / ``max_repeats``: the
    rounds an adaptive measurement had to run and could run (None: a fixed number), which the decision rule needs
    to know how often it looked (:func:`dlo.measure.decide.decide`).
    """

    name: str
    times_s: list[float]
    items_per_call: int
    unit: str = "img/s"
    peak_memory_bytes: int | None = None
    memory_kind: str | None = None
    device: str = "cpu"
    warmup: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    steady: bool | None = None
    warmup_times_s: list[float] = field(default_factory=list)
    min_repeats: int | None = None
    max_repeats: int | None = None

    @property
    def median_s(self) -> float:
        return statistics.median(self.times_s)

    @property
    def q25_s(self) -> float:
        return quartiles(self.times_s)[0]

    @property
    def q75_s(self) -> float:
        return quartiles(self.times_s)[1]

    @property
    def spread(self) -> float:
        """Interquartile range over median (0.1: the middle half of the repeats lie within 10 %)."""
        q25, q75 = quartiles(self.times_s)
        return (q75 - q25) / self.median_s if self.median_s > 0 else 0.0

    @property
    def throughput(self) -> float:
        return self.items_per_call / self.median_s

    @property
    def throughput_low(self) -> float:
        """Throughput at the slow quartile (``q75_s``): the bottom of the noise band."""
        return self.items_per_call / self.q75_s

    @property
    def throughput_high(self) -> float:
        """Throughput at the fast quartile (``q25_s``): the top of the noise band."""
        return self.items_per_call / self.q25_s

    def to_record(self) -> dict[str, Any]:
        rec = asdict(self)
        q25, q75 = quartiles(self.times_s)
        rec.update(median_s=self.median_s, q25_s=q25, q75_s=q75, min_s=min(self.times_s), max_s=max(self.times_s),
                   spread=self.spread, throughput=self.throughput, throughput_low=self.throughput_low,
                   throughput_high=self.throughput_high, repeats=len(self.times_s))
        return rec

    def __str__(self) -> str:
        mem = (f", peak mem {self.peak_memory_bytes / 2**20:.0f} MiB ({self.memory_kind})"
               if self.peak_memory_bytes else "")
        steady = {True: ", steady", False: ", NOT steady", None: ""}[self.steady]
        band = f"[{format_number(self.throughput_low)}-{format_number(self.throughput_high)}]"
        return (f"{self.name}: {format_number(self.throughput)} {self.unit} {band} (median [IQR] of "
                f"{len(self.times_s)} after {self.warmup} warm-up call(s){steady}; "
                f"{self.median_s * 1000:.1f} ms/call{mem})")


@dataclass
class Candidate:
    """One configuration to time: ``call()`` runs one step of it (a closure over its model and data) and
    processes ``items_per_call`` items on ``device``."""

    name: str
    call: Callable[[], Any]
    items_per_call: int
    device: str | torch.device = "cpu"
    extra: dict[str, Any] = field(default_factory=dict)


def measure_interleaved(candidates: Sequence[Candidate] | Mapping[str, Callable[[], Any]], *,
                        items_per_call: int | None = None, device: torch.device | str | None = None,
                        repeats: int = 5, warmup: Warmup | int = Warmup(), unit: str = "img/s",
                        track_memory: bool = True, progress: bool = True, timer: Timer | None = None,
                        max_repeats: int | None = None,
                        until: Callable[[dict[str, Measurement]], bool] | None = None) -> dict[str, Measurement]:
    """Time several configurations that are to be compared, *interleaved*.

    Each candidate is first warmed up (until steady with a :class:`Warmup` policy, the default); then the
    timed calls go round-robin, ``repeats`` rounds, in alternating order (A B C, C B A, A B C, ...). Whatever
    drifts during the run (another job on the machine, the clock slowing down as the chip heats up) then hits
    every candidate alike, where AAAAA BBBBB would blame it on B; and the alternation gives no candidate the
    advantage of always running first (or last) in its round. Returns one :class:`Measurement` per candidate,
    by name, in order.

    **Adaptive repeats.** With ``max_repeats`` above ``repeats``, more rounds are run until the decision is
    clear or ``max_repeats`` rounds have run: ``until(measurements so far)`` is asked at the round counts of
    :func:`dlo.measure.decide.looks` and stops the rounds when it returns True. By default it is the decision
    rule (:func:`dlo.measure.decide.decide`) of the last candidate against the first (a new configuration
    against its reference). What is still unclear at the cap is then reported "undecided" by the rule.

    ``candidates``: a list of :class:`Candidate`, or a dict ``{name: call}`` with the shared ``items_per_call``
    and ``device``. ``timer`` replaces the clock (tests); by default each candidate uses its device's
    :func:`make_timer`. With ``track_memory`` each call runs inside :class:`PeakMemory` and a candidate keeps
    its largest peak (on a CPU the RSS of the whole process: the candidates' allocations add up).
    """
    cands = _candidates(candidates, items_per_call, device)
    _check_counts(warmup, repeats, max_repeats)
    cap = max_repeats if max_repeats is not None else repeats
    if until is None and cap > repeats and len(cands) > 1:
        until = pair_decider(cands[-1].name, cands[0].name)
    devices = {c.name: torch.device(c.device) for c in cands}
    timers = {c.name: timer or make_timer(devices[c.name]) for c in cands}
    peaks: dict[str, int] = {c.name: 0 for c in cands}
    kinds: dict[str, str | None] = {c.name: None for c in cands}
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(desc=" / ".join(c.name for c in cands), leave=False, unit="call")

    def run_once(c: Candidate) -> float:
        if track_memory:
            with PeakMemory(devices[c.name]) as mem:
                seconds = float(timers[c.name](c.call))
            peaks[c.name], kinds[c.name] = max(peaks[c.name], mem.peak_bytes), mem.kind
        else:
            seconds = float(timers[c.name](c.call))
        if bar is not None:
            bar.update()
        return seconds

    def results() -> dict[str, Measurement]:
        return {c.name: Measurement(name=c.name, times_s=list(timed[c.name]), items_per_call=c.items_per_call,
                                    unit=unit, peak_memory_bytes=peaks[c.name] if track_memory else None,
                                    memory_kind=kinds[c.name], device=str(devices[c.name]),
                                    warmup=len(warm[c.name].times), extra=dict(c.extra), steady=warm[c.name].steady,
                                    warmup_times_s=warm[c.name].times,
                                    min_repeats=repeats if cap > repeats else None,
                                    max_repeats=cap if cap > repeats else None)
                for c in cands}

    try:
        warm: dict[str, _WarmingUp] = {}
        for c in cands:  # warm-ups one after the other: each needs its own calls until steady
            warm[c.name] = _WarmingUp(warmup)
            while not warm[c.name].done:
                warm[c.name].times.append(run_once(c))
        timed: dict[str, list[float]] = {c.name: [] for c in cands}
        checks = set(looks(repeats, cap)) if cap > repeats and until is not None else set()
        for r in range(cap):  # A B C, C B A, A B C ...
            for c in (cands if r % 2 == 0 else cands[::-1]):
                timed[c.name].append(run_once(c))
            done = r + 1
            if done >= repeats and (not checks or (done in checks and until(results()))):
                break  # a fixed number of rounds, or the decision is clear
    finally:
        if bar is not None:
            bar.close()
    return results()


def _candidates(candidates: Sequence[Candidate] | Mapping[str, Callable[[], Any]], items_per_call: int | None,
                device: torch.device | str | None) -> list[Candidate]:
    if isinstance(candidates, Mapping):
        if items_per_call is None:
            raise ValueError("measure_interleaved({name: call}) needs items_per_call (and device)")
        cands = [Candidate(name, call, items_per_call, device if device is not None else "cpu")
                 for name, call in candidates.items()]
    else:
        cands = list(candidates)
    if not cands:
        raise ValueError("measure_interleaved needs at least one candidate")
    names = [c.name for c in cands]
    if len(set(names)) != len(names):
        raise ValueError(f"candidate names must differ, got {names}")
    return cands


def measure(name: str, fn: Callable[[], Any], *, items_per_call: int, warmup: Warmup | int = 1, repeats: int = 5,
            device: torch.device | str = "cpu", unit: str = "img/s", track_memory: bool = True,
            progress: bool = True, timer: Timer | None = None, **extra: Any) -> Measurement:
    """Time ``fn`` alone: ``warmup`` calls (a number, or a :class:`Warmup` policy: until steady), then
    ``repeats`` timed ones, tracking its peak memory; returns a :class:`Measurement`. To compare
    configurations, time them together with :func:`measure_interleaved`."""
    return measure_interleaved([Candidate(name, fn, items_per_call, device, dict(extra))], repeats=repeats,
                               warmup=warmup, unit=unit, track_memory=track_memory, progress=progress,
                               timer=timer)[name]


def step_call(step: Callable[[torch.Tensor, torch.Tensor], Any],
              batches: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> Callable[[], Any]:
    """A call without arguments that runs ``step(images, labels)`` on the next of ``batches`` (cycled)."""
    if not batches:
        raise ValueError("measure_steps needs at least one pre-loaded batch")
    state = {"i": 0}

    def call() -> Any:
        images, labels = batches[state["i"] % len(batches)]
        state["i"] += 1
        return step(images, labels)

    return call


def measure_steps(name: str, step: Callable[[torch.Tensor, torch.Tensor], Any],
                  batches: list[tuple[torch.Tensor, torch.Tensor]], *, warmup: Warmup | int = 1, repeats: int = 5,
                  device: torch.device | str = "cpu", **extra: Any) -> Measurement:
    """Time ``step(images, labels)`` on pre-loaded ``batches`` (cycled), in images per second.

    Batches are already on the device, so this measures the training step alone: the data pipeline
    is a separate question (Jour2)."""
    call = step_call(step, batches)
    extra.setdefault("batch_size", len(batches[0][0]))
    return measure(name, call, items_per_call=len(batches[0][0]), warmup=warmup, repeats=repeats, device=device,
                   **extra)
