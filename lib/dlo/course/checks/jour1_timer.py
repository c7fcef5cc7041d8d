"""Checker of Jour 1's step timer (jour1.ipynb, step ``timer``): ``time_step(step, sync, warmup, repeats)``.

The answer is judged by what it measures, not by what it calls. It first runs on a simulated device: ``step()``
only queues its work (it returns after a short launch, the work finishes later, as on a GPU), ``sync()`` waits
until the queued work is done, and the clock (``time.perf_counter`` and its siblings, patched) reads the
simulated time. Every call does a different, known amount of work (the first two also pay one-off costs), so the
times returned say which calls were timed and whether the clock waited for them; they are compared with what a
correct timer returns, for several warm-up and repeat counts (0 warm-up calls and 1 repeat included). Then it
times a small real step next to :func:`dlo.measure.bench.time_calls`: their medians must agree within a factor
of 3 (units and the real clock, with a margin no busy machine reaches).
"""
from __future__ import annotations

import math
import statistics
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch

from dlo.course.checks.framework import CheckFailed, expect, register
from dlo.measure import bench

J1 = "Jour1/jour1.ipynb"

#: Host seconds a step() takes to queue its work (what a clock read without waiting measures).
LAUNCH_S = 1e-4
#: Extra device seconds of the first calls: allocation, autotuning (what a warm-up keeps out of the times).
ONE_OFF_S = (0.5, 0.2)
#: The (warmup, repeats) cases, the most telling first.
CASES = ((2, 3), (0, 1), (3, 5), (1, 4), (0, 3))
_CLOCKS = ("perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "time", "time_ns")


def work_s(k: int) -> float:
    """Device seconds of call ``k`` (0 = the first): a little more each call, so that each time names its call."""
    return 0.010 * (1 + 0.01 * k) + (ONE_OFF_S[k] if k < len(ONE_OFF_S) else 0.0)


class FakeDevice:
    """An asynchronous device and the host clock, simulated: what happened, in order, is in ``events``."""

    def __init__(self) -> None:
        self.now = 0.0  # host time, seconds
        self.busy_until = 0.0  # when the queued work is done
        self.calls = 0
        self.events: list[tuple[str, int]] = []  # ("step", k), ("sync", 0), ("clock", 1 if the device was idle)

    def step(self) -> None:
        k, self.calls = self.calls, self.calls + 1
        self.busy_until = max(self.now, self.busy_until) + work_s(k)
        self.now += LAUNCH_S
        self.events.append(("step", k))

    def sync(self) -> None:
        self.now = max(self.now, self.busy_until)
        self.events.append(("sync", 0))

    def clock(self) -> float:
        self.events.append(("clock", int(self.busy_until <= self.now)))
        return self.now


def reference(step: Callable[[], Any], sync: Callable[[], None], warmup: int, repeats: int) -> list[float]:
    """What a correct timer returns (the check's yardstick)."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t0)
    return times


@contextmanager
def fake_clock(dev: FakeDevice, fn: Callable) -> Iterator[None]:
    """The time module's clocks (and the same functions imported by name into ``fn``'s globals) read ``dev``."""
    fakes = {"perf_counter": dev.clock, "monotonic": dev.clock, "time": dev.clock,
             "perf_counter_ns": lambda: round(dev.clock() * 1e9), "monotonic_ns": lambda: round(dev.clock() * 1e9),
             "time_ns": lambda: round(dev.clock() * 1e9)}
    real = {name: getattr(time, name) for name in _CLOCKS}
    scope = getattr(fn, "__globals__", {})
    by_id = {id(clock): name for name, clock in real.items()}
    imported = {key: by_id[id(value)] for key, value in list(scope.items()) if id(value) in by_id}
    try:
        for name in _CLOCKS:
            setattr(time, name, fakes[name])
        for key, name in imported.items():
            scope[key] = fakes[name]
        yield
    finally:
        for name, clock in real.items():
            setattr(time, name, clock)
        for key, name in imported.items():
            scope[key] = real[name]


def _run(time_step: Callable, step: Callable, sync: Callable, warmup: int, repeats: int) -> Any:
    try:
        return time_step(step, sync, warmup=warmup, repeats=repeats)
    except (CheckFailed, NotImplementedError):
        raise
    except Exception as exc:  # noqa: BLE001 -- the student's error, said in one line
        raise CheckFailed(f"time_step(step, sync, warmup={warmup}, repeats={repeats}) raised "
                          f"{type(exc).__name__}: {exc}") from None


def _close(a: float, b: float, rel: float = 1e-6) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-12)


def _all_close(got: list[float], want: list[float], rel: float = 1e-6) -> bool:
    return len(got) == len(want) and all(_close(g, w, rel) for g, w in zip(got, want))


def _number(out: Any, want: list[float], w: int, r: int) -> None:
    """``out`` is one number, not a list: name what it is (always raises)."""
    v = float(out)
    expect(not _close(v, sum(want), 1e-4), f"you returned the total time of the {r} timed calls ({v:.4g} s): return "
                                           "a list with one time per call (the median and the spread come from it)")
    expect(not _close(v, statistics.mean(want), 1e-4),
           f"you returned the mean time per call ({v:.4g} s): return the list of per-call times (the median and the "
           "spread come from it)")
    expect(False, f"return a list of seconds per timed call, not one number (got {v!r} for warmup={w}, repeats={r})")


def _wrong_length(got: list[float], want: list[float], w: int, r: int) -> None:
    """``got`` does not hold one time per timed call: name what it holds (always raises)."""
    timed_all = [work_s(k) for k in range(w + r)]
    expect(not (w and len(got) == w + r and _all_close(got[w:], want)),
           f"the warm-up calls were timed too: {len(got)} times returned for warmup={w}, repeats={r}; keep the "
           "warm-up calls out of the times (their one-off costs are what the warm-up is for)")
    expect(not (len(got) == w + r and _all_close(got, timed_all)),
           f"the warm-up calls were timed too: {len(got)} times returned for warmup={w}, repeats={r}")
    if len(got) == 1 and r > 1:
        expect(not _close(got[0], sum(want), 1e-4), "you returned the total time of the timed calls as one "
                                                    "value: return one time per call")
        expect(not _close(got[0], want[-1], 1e-4), f"only the last call was timed: one time returned for "
                                                   f"repeats={r}; time each call")
    expect(False, f"return one time per timed call: warmup={w}, repeats={r} gave {len(got)} times")


def _wrong_values(got: list[float], want: list[float], dev: FakeDevice, w: int, r: int) -> None:
    """One time per call, but not the right ones: name the mistake (always raises)."""
    syncs = sum(1 for e, _ in dev.events if e == "sync")
    shown = f"(warmup={w}, repeats={r}: expected {_fmt(want)} s, got {_fmt(got)})"
    expect(not _all_close(got, [x * 1e9 for x in want], 1e-4),
           f"these are nanoseconds: perf_counter_ns counts in ns; return seconds {shown}")
    expect(not _all_close(got, [x * 1e3 for x in want], 1e-4), f"these are milliseconds: return seconds {shown}")
    if all(g < 0.1 * min(want) for g in got):
        expect(syncs > 0, f"the clock never waited for the device (sync() was never called): on a GPU step() only "
                          f"queues the work, so the clock measured its launch, not the work {shown}")
        expect(False, f"the clock was read before sync() returned: it measured the launch of the work, not the work "
                      f"itself; read it after the device has finished {shown}")
    cumulative = [sum(want[: i + 1]) for i in range(len(want))]
    expect(not (r > 1 and _all_close(got, cumulative, 1e-4)),
           f"the clock started once, before the loop: each time includes every call before it; start it again "
           f"for each call {shown}")
    expect(not (r > 1 and _all_close(got, [want[-1]] * r, 1e-4)), f"only the last call was timed {shown}")
    expect(not (r > 1 and _all_close(got, [statistics.mean(want)] * r, 1e-4)),
           f"every value is the mean of the calls: return each call's own time {shown}")
    expect(not (w and _all_close(got, [work_s(k) for k in range(r)], 1e-4)),
           f"the warm-up calls were timed: these are the times of the first calls, one-off costs included {shown}")
    if w and got[0] > want[0] * 1.01 and _all_close(got[1:], want[1:], 1e-4):
        expect(False, f"no sync before starting the clock: the first timed call also paid for the warm-up work still "
                      f"queued on the device; wait for the device before the clock starts {shown}")
    expect(False, f"these are not the times of the timed calls alone {shown}")


def _fmt(xs: list[float]) -> str:
    return "[" + ", ".join(f"{x:.4g}" for x in xs[:6]) + (", ...]" if len(xs) > 6 else "]")


def _simulated(time_step: Callable, w: int, r: int) -> None:
    dev = FakeDevice()
    with fake_clock(dev, time_step):
        out = _run(time_step, dev.step, dev.sync, w, r)
    want = [work_s(k) for k in range(w, w + r)]
    expect(any(e == "clock" for e, _ in dev.events),
           "the clock was never read: time the calls with time.perf_counter (or perf_counter_ns), which the check "
           "replaces by a simulated device's clock")
    if isinstance(out, (int, float)) and not isinstance(out, bool):
        _number(out, want, w, r)
    expect(isinstance(out, (list, tuple)) and all(isinstance(v, (int, float)) for v in out),
           f"return a list of seconds (floats), one per timed call, got {type(out).__name__}")
    got = [float(v) for v in out]
    expect(not (w and dev.calls == r), f"no warm-up: step() ran {dev.calls} times for warmup={w}, repeats={r}; the "
                                       "first calls pay one-off costs (allocation, autotuning) and must run untimed")
    expect(dev.calls == w + r, f"step() ran {dev.calls} times for warmup={w}, repeats={r}: expected {w + r}, the "
                               "warm-up calls untimed, then the timed ones")
    if len(got) != r:
        _wrong_length(got, want, w, r)
    if not _all_close(got, want, 1e-4):
        _wrong_values(got, want, dev, w, r)


def _real(time_step: Callable) -> float:
    """Median of the student's timer over that of dlo.measure.bench, on the same small real step."""
    x = torch.randn(64, 64)

    def step() -> None:
        time.sleep(0.002)
        (x @ x).sum()

    mine = _run(time_step, step, lambda: bench.synchronize("cpu"), 2, 7)
    expect(isinstance(mine, (list, tuple)) and len(mine) == 7 and all(v > 0 for v in mine),
           "on a real step, return 7 positive times for repeats=7")
    ref = bench.time_calls(step, warmup=2, repeats=7, device="cpu")
    return statistics.median(mine) / statistics.median(ref)


@register("jour1", "timer", ("time_step",), J1)
def _check_timer(time_step: Callable) -> str:
    for w, r in CASES:
        _simulated(time_step, w, r)
    ratio = _real(time_step)
    expect(1 / 3 < ratio < 3, f"on a real 2 ms step your timer reads {ratio:.3g} x what dlo.measure.bench measures: "
                              "return seconds, read with a clock that counts wall time (time.perf_counter)")
    return (f"on a simulated asynchronous device every timed call is measured alone, after the warm-up, waiting for "
            f"the device ({len(CASES)} warm-up/repeat counts); on a real step it reads {ratio:.2f} x dlo.measure.bench")
