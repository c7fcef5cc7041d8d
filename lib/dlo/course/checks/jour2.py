"""Checkers of Jour2/dataloader.ipynb (course ``dataloader``). The ``augment`` steps are in
:mod:`dlo.course.checks.augment`, the ``ddp`` steps in :mod:`dlo.course.checks.ddp`."""
from __future__ import annotations

import numbers
import time
from typing import Callable

import dlo.course.checks.augment  # noqa: F401 -- registers the augment steps (Jour 2's other notebook)
from dlo.course.checks.cases import Case, run_student
from dlo.course.checks.dataloader_cases import (BUDGETS, LOADERS, FakeClock, SimLoader, clock_in_place,
                                                reference_wait_times, reference_workers)
from dlo.course.checks.framework import CheckFailed, expect, register

LOADER_NB = "Jour2/dataloader.ipynb"


class _SlowLoader:
    """An iterable whose ``iter()`` takes ``start_s`` and whose batches take the given times."""

    def __init__(self, start_s: float, batch_s: list[float]) -> None:
        self.start_s, self.batch_s = start_s, batch_s
        self.served = 0
        self.iters = 0  # how many times iteration started (each start restarts a real loader's workers)

    def __iter__(self):
        self.iters += 1
        time.sleep(self.start_s)
        return self._batches()

    def _batches(self):
        for i, s in enumerate(self.batch_s):
            time.sleep(s)
            self.served += 1
            yield i


def _wait_difference(out, loader: SimLoader, n: int, want: tuple) -> str:
    """How the answer's measurement differs from the lesson's on the same simulated loader ("" when it does not)."""
    if not (isinstance(out, tuple) and len(out) == 2):
        return "return a tuple (first_s, waits)"
    first, waits = out
    if loader.iters != 1:
        return (f"iteration over the loader started {loader.iters} times: each start launches the workers again (and "
                "restarts the epoch), so the waits you measured include a restart; keep one iterator for the whole "
                "measurement")
    if loader.served > n:
        return f"fetch n_iters = {n} batches, not {loader.served}"
    if not isinstance(waits, (list, tuple)) or len(waits) != n - 1:
        return (f"waits holds the n_iters - 1 = {n - 1} batches after the first, got "
                f"{len(waits) if isinstance(waits, (list, tuple)) else type(waits).__name__}")
    first_want, waits_want = want
    if not abs(first - first_want) < 1e-6:
        return (f"first_s must include iter() ({loader.start_s:g} s here) and the first batch "
                f"({first_want - loader.start_s:.3g} s): {first_want:.3g} s, got {first:.3g} s")
    cumulative = [sum(waits_want[:i + 1]) for i in range(len(waits_want))]
    if cumulative != list(waits_want) and all(abs(w - c) < 1e-6 for w, c in zip(waits, cumulative)):
        return "each wait grows with the ones before it: restart the clock right before each next(it) (time inside next())"
    for i, (w, e) in enumerate(zip(waits, waits_want)):
        if not abs(w - e) < 1e-6:
            return f"wait {i} should be {e:.3g} s (time inside next()), got {w:.3g} s"
    return ""


@register("dataloader", "wait", ("wait_times",), LOADER_NB)
def _check_wait(wait_times: Callable) -> str:
    for case in LOADERS:
        clock = FakeClock()
        with clock_in_place(clock, reference_wait_times):
            want = reference_wait_times(SimLoader(clock, **case.kwargs["loader"]), case.kwargs["n_iters"])
        clock = FakeClock()
        loader = SimLoader(clock, **case.kwargs["loader"])
        with clock_in_place(clock, wait_times):
            # the loader itself, not a copy: what it served and how often it was iterated is judged
            out = run_student(lambda: wait_times(loader, case.kwargs["n_iters"]), Case(case.label))
        if not clock.read:  # another clock than time's: measured on a loader that really sleeps
            return _check_wait_on_sleeps(wait_times)
        problem = _wait_difference(out, loader, case.kwargs["n_iters"], want)
        if problem:
            raise CheckFailed(f"with {case.label}: {problem}")
    return (f"first-batch latency and per-batch waits measured around iter() and next() ({len(LOADERS)} simulated "
            "loaders: 0 to 4 workers, the loader the bottleneck or not)")


def _check_wait_on_sleeps(wait_times: Callable) -> str:
    """The measurement on a loader that sleeps, for an answer that reads no clock of the time module."""
    fake = _SlowLoader(0.15, [0.05, 0.0, 0.12, 0.0, 0.06, 0.3, 0.3])
    out = wait_times(fake, 5)
    expect(isinstance(out, tuple) and len(out) == 2, "return a tuple (first_s, waits)")
    first, waits = out
    expect(fake.iters == 1, f"iteration over the loader started {fake.iters} times: keep one iterator for the whole "
                            "measurement")
    expect(len(waits) == 4, f"waits holds the n_iters - 1 = 4 batches after the first, got {len(waits)}")
    expect(first >= 0.01 or any(w >= 0.01 for w in waits),
           f"your clock did not move while the loader slept (0.15 s in iter(), 0.05 s for the first batch): got "
           f"{first:.3f} s: time with a wall clock (time.perf_counter), not the CPU time of this process")
    expect(0.19 <= first < 0.35, f"first_s must include iter() (0.15 s here) and the first batch (0.05 s): got "
                                 f"{first:.3f} s")
    bad = [(i, w, e) for i, (w, e) in enumerate(zip(waits, [0.0, 0.12, 0.0, 0.06])) if not (e - 0.005 <= w < e + 0.08)]
    if bad:
        i, w, e = bad[0]
        raise CheckFailed(f"wait {i} should be about {e:.2f} s (time inside next()), got {w:.3f} s")
    return "first-batch latency and per-batch waits measured around iter() and next() (on a loader that sleeps)"


@register("dataloader", "budget", ("workers_per_rank",), LOADER_NB)
def _check_budget(workers_per_rank: Callable) -> str:
    for case in BUDGETS:
        cores, ranks = case.kwargs["cores"], case.kwargs["ranks_per_node"]
        expected, got = reference_workers(cores, ranks), run_student(workers_per_rank, case)
        where = case.label
        expect(isinstance(got, numbers.Integral) and not isinstance(got, bool),
               f"{where}: return a whole number of workers per rank (an int), got {got!r}: use integer division //")
        if got != expected:
            expect(not (ranks > 1 and got == max(0, cores - 1)),
                   f"{where}: divide the cores between the {ranks} ranks of the node: {expected} workers per rank, "
                   f"got {got}")
            expect(got != max(0, (cores - 1) // ranks),
                   f"{where}: keep one core per rank (each rank runs its own training loop), not one per node: "
                   f"{expected} workers per rank, got {got}")
            expect(not (expected == 0 and got == 1),
                   f"{where}: no core to spare, so 0 workers per rank (the main process loads the batches), got 1")
            raise CheckFailed(f"{where}: {expected} workers per rank, got {got!r}")
    return f"cores split between ranks, one kept per rank for its training loop ({len(BUDGETS)} node layouts)"
