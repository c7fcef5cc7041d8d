"""Family: part of the result right (the structure of the measurement). Times with time.process_time, the CPU time
of this process: a loop that waits for the loader uses no CPU, so every wait reads about 0."""
import time

EXPECT = "wall clock"


def wait_times(loader, n_iters):
    start = time.process_time()
    it = iter(loader)
    next(it)
    first_s = time.process_time() - start
    waits = []
    for _ in range(n_iters - 1):
        t0 = time.process_time()
        next(it)
        waits.append(time.process_time() - t0)
    return first_s, waits
