"""Inputs that never reach the mistake: the first batch is taken from one iterator, the waits from a for loop that calls iter() again (the workers start a second time)."""
import time

EXPECT = 'iter'


def wait_times(loader, n_iters):
    start = time.perf_counter()
    next(iter(loader))
    first_s = time.perf_counter() - start
    waits = []
    t0 = time.perf_counter()
    for i, _ in enumerate(loader):
        waits.append(time.perf_counter() - t0)
        if len(waits) == n_iters - 1:
            break
        t0 = time.perf_counter()
    return first_s, waits
