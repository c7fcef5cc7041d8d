"""Stops the first clock right after iter(loader): the first batch itself is left out."""
import time

EXPECT = "first batch"


def wait_times(loader, n_iters):
    start = time.perf_counter()
    it = iter(loader)
    first_s = time.perf_counter() - start
    next(it)
    waits = []
    for _ in range(n_iters - 1):
        t0 = time.perf_counter()
        next(it)
        waits.append(time.perf_counter() - t0)
    return first_s, waits
