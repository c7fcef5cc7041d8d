"""Checkers of Jour2/dataloader.ipynb (course ``dataloader``). The ``augment`` steps are in
:mod:`dlo.course.checks.augment`, the ``ddp`` steps in :mod:`dlo.course.checks.ddp`."""
from __future__ import annotations

import time
from typing import Callable

import dlo.course.checks.augment  # noqa: F401 -- registers the augment steps (Jour 2's other notebook)
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


@register("dataloader", "wait", ("wait_times",), LOADER_NB)
def _check_wait(wait_times: Callable) -> str:
    fake = _SlowLoader(0.15, [0.05, 0.0, 0.12, 0.0, 0.06, 0.3, 0.3])
    out = wait_times(fake, 5)
    expect(isinstance(out, tuple) and len(out) == 2, "return a tuple (first_s, waits)")
    first, waits = out
    expect(fake.iters == 1,
           f"iteration over the loader started {fake.iters} times: each start launches the workers again (and "
           "restarts the epoch), so the waits you measured include a restart; keep one iterator for the whole "
           "measurement")
    expect(fake.served <= 5, f"fetch n_iters = 5 batches, not {fake.served}")
    expect(len(waits) == 4, f"waits holds the n_iters - 1 = 4 batches after the first, got {len(waits)}")
    expect(0.19 <= first < 0.35, f"first_s must include iter() (0.15 s here) and the first batch (0.05 s): got {first:.3f} s")
    expected = [0.0, 0.12, 0.0, 0.06]
    cumulative = [sum(expected[:i + 1]) for i in range(len(expected))]
    expect(not all(c - 0.005 <= w < c + 0.08 for w, c in zip(waits, cumulative)),
           "each wait grows with the ones before it: restart the clock right before each next(it) (time inside next())")
    bad = [(i, w, e) for i, (w, e) in enumerate(zip(waits, expected)) if not (e - 0.005 <= w < e + 0.08)]
    if bad:
        i, w, e = bad[0]
        raise CheckFailed(f"wait {i} should be about {e:.2f} s (time inside next()), got {w:.3f} s")
    return "first-batch latency and per-batch waits measured around iter() and next()"


@register("dataloader", "budget", ("workers_per_rank",), LOADER_NB)
def _check_budget(workers_per_rank: Callable) -> str:
    cases = {(10, 1): 9, (40, 4): 9, (16, 4): 3, (4, 4): 0, (2, 1): 1, (3, 2): 0, (1, 1): 0, (1, 4): 0, (10, 4): 1,
             (6, 4): 0, (64, 8): 7}
    for (cores, ranks), expected in cases.items():
        got = workers_per_rank(cores, ranks)
        where = f"{cores} cores shared by {ranks} rank(s)"
        expect(isinstance(got, int) and not isinstance(got, bool),
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
    return "cores split between ranks, one kept per rank for its training loop"

