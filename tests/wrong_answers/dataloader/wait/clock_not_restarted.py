"""Starts the clock once before the loop: each wait includes all the ones before it."""
import time

EXPECT = "restart the clock"


def wait_times(loader, n_iters):
    start = time.perf_counter()
    it = iter(loader)
    next(it)
    first_s = time.perf_counter() - start
    waits = []
    t0 = time.perf_counter()
    for _ in range(n_iters - 1):
        next(it)
        waits.append(time.perf_counter() - t0)
    return first_s, waits
