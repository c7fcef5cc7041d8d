"""Family: inputs that never reach the mistake (every case measured 5 batches). Times the notebook's 4 batches after
the first instead of n_iters - 1."""
import time

EXPECT = "fetch n_iters = 2 batches, not 5"


def wait_times(loader, n_iters):
    start = time.perf_counter()
    it = iter(loader)
    next(it)
    first_s = time.perf_counter() - start
    waits = []
    for _ in range(4):
        t0 = time.perf_counter()
        next(it)
        waits.append(time.perf_counter() - t0)
    return first_s, waits
