"""Times n_iters batches after the first: one batch too many."""
import time

EXPECT = 'fetch n_iters = 5 batches'


def wait_times(loader, n_iters):
    start = time.perf_counter()
    it = iter(loader)
    next(it)
    first_s = time.perf_counter() - start
    waits = []
    for _ in range(n_iters):
        t0 = time.perf_counter()
        next(it)
        waits.append(time.perf_counter() - t0)
    return first_s, waits
