"""Generated cases of the data-loader checkers (:mod:`dlo.course.checks.jour2`).

``wait``: simulated loaders on a simulated clock, so that every wait is known exactly and a check takes no time:
0 to 4 workers (each takes time to start in ``iter()``; batch i comes from worker i mod n, one batch after the
other per worker), batch sizes 1 to 64, per-sample costs from 0 (the loader is never what the loop waits for
after the start) to 5 ms (it is), 2 to 9 batches measured. The answer and the lesson's measurement (clock started
before ``iter()``, then around each ``next()``) run on identical loaders and clocks; the first-batch latency and
every wait are compared. ``budget``: cores 1 to 256 shared by 1 to 16 ranks (fewer cores than ranks, exactly
one or two per rank, uneven splits), against the rule of :func:`dlo.lessons.loader.advice.core_budget`
(cores // ranks - 1, at least 0). Values are compared (nothing is differentiated: no gradient applies here).
"""
from __future__ import annotations

import contextlib
import random
import time
from typing import Callable, Iterator

from dlo.course.checks.cases import Case, seeded

_CLOCKS = ("perf_counter", "monotonic", "time")


class FakeClock:
    """A clock that moves only when a simulated loader says so; ``read`` counts the answer's readings."""

    def __init__(self) -> None:
        self.now, self.read = 1000.0, 0

    def seconds(self) -> float:
        self.read += 1
        return self.now

    def nanoseconds(self) -> int:
        return int(round(self.seconds() * 1e9))


@contextlib.contextmanager
def clock_in_place(clock: FakeClock, fn: Callable) -> Iterator[None]:
    """time.perf_counter / monotonic / time (and their _ns) read ``clock``, in the time module and where ``fn``'s
    module bound them by name (``from time import perf_counter``)."""
    real = {name: getattr(time, name) for name in _CLOCKS}
    real.update({f"{name}_ns": getattr(time, f"{name}_ns") for name in _CLOCKS})
    fake = {name: (clock.nanoseconds if name.endswith("_ns") else clock.seconds) for name in real}
    names = getattr(fn, "__globals__", {})
    bound = {k: v for k, v in names.items() if any(v is f for f in real.values())}
    try:
        for name in real:
            setattr(time, name, fake[name])
        for k, v in bound.items():
            names[k] = fake[next(n for n, f in real.items() if f is v)]
        yield
    finally:
        for name, f in real.items():
            setattr(time, name, f)
        names.update(bound)


class SimLoader:
    """A loader on ``clock``: ``iter()`` takes ``start_s`` (the workers starting); without workers each batch takes
    batch_size x sample_s when asked for; with ``workers`` they load in parallel from the start, worker k batches k,
    k + workers, ..., each in batch_size x sample_s. ``script``: the seconds of each batch, as asked (no workers)."""

    def __init__(self, clock: FakeClock, *, workers: int = 0, batch_size: int = 1, sample_s: float = 0.0,
                 start_s: float = 0.0, script: list[float] | None = None, n_batches: int = 50) -> None:
        self.clock, self.workers, self.batch_s, self.start_s = clock, workers, batch_size * sample_s, start_s
        self.script, self.n_batches = script, (len(script) if script is not None else n_batches)
        self.served = self.iters = 0

    def __iter__(self):
        self.iters += 1
        self.clock.now += self.start_s
        return self._batches(self.clock.now)

    def __len__(self) -> int:
        return self.n_batches

    def _batches(self, t0: float):
        for i in range(self.n_batches):
            if self.script is not None:
                self.clock.now += self.script[i]
            elif self.workers == 0:
                self.clock.now += self.batch_s
            else:
                self.clock.now = max(self.clock.now, t0 + (i // self.workers + 1) * self.batch_s)
            self.served += 1
            yield i


def reference_wait_times(loader, n_iters):
    """The lesson's measurement: the clock starts before iter(loader); then one clock around each next()."""
    start = time.perf_counter()
    it = iter(loader)
    next(it)
    first_s = time.perf_counter() - start
    waits = []
    for _ in range(n_iters - 1):
        t0 = time.perf_counter()
        next(it)
        waits.append(time.perf_counter() - t0)
    return first_s, waits


#: the hand-written loader: 0.15 s to start, batches of 0.05, 0, 0.12, 0, 0.06 s; 5 measured of 7
FIXED_LOADERS = [Case("a loader that takes 0.15 s to start, then batches of 0.05, 0, 0.12, 0, 0.06 s, n_iters=5",
                      {"loader": dict(start_s=0.15, script=[0.05, 0.0, 0.12, 0.0, 0.06, 0.3, 0.3]), "n_iters": 5}, 0),
                 Case("a loader with 2 workers (0.5 s to start), batch 8, 0.01 s per sample, n_iters=2",
                      {"loader": dict(workers=2, batch_size=8, sample_s=0.01, start_s=0.5), "n_iters": 2}, 0)]


def _draw_loader(rng: random.Random) -> Case:
    workers, batch = rng.randint(0, 4), rng.choice([1, 4, 16, 64])
    sample_s = rng.choice([0.0, 0.0005, 0.002, 0.005])
    start_s = round(workers * rng.uniform(0.1, 0.6), 3)
    n_iters = rng.randint(2, 9)
    label = (f"a loader with {workers} workers ({start_s} s to start), batch {batch}, {sample_s} s per sample, "
             f"n_iters={n_iters}")
    spec = dict(workers=workers, batch_size=batch, sample_s=sample_s, start_s=start_s, n_batches=n_iters + 3)
    return Case(label, {"loader": spec, "n_iters": n_iters}, 1 + n_iters)


LOADERS = seeded(_draw_loader, 14, seed=4, fixed=FIXED_LOADERS)


def reference_workers(cores: int, ranks_per_node: int) -> int:
    """core_budget's rule: the cores split between the ranks, one kept per rank for its training loop."""
    return max(0, cores // ranks_per_node - 1)


def _draw_budget(rng: random.Random) -> Case:
    ranks = rng.choice([1, 2, 3, 4, 8, 16])
    cores = rng.choice([rng.randint(1, ranks), ranks * 2, ranks * 2 + 1, rng.randint(1, 256)])
    return Case(f"{cores} cores shared by {ranks} rank(s)", {"cores": cores, "ranks_per_node": ranks}, cores)


_BUDGET_FIXED = [(10, 1), (40, 4), (16, 4), (4, 4), (2, 1), (3, 2), (1, 1), (1, 4), (10, 4), (6, 4), (64, 8),
                 (256, 1), (255, 16)]
BUDGETS = seeded(_draw_budget, 40, seed=6, fixed=[
    Case(f"{c} cores shared by {r} rank(s)", {"cores": c, "ranks_per_node": r}, 0) for c, r in _BUDGET_FIXED])
