"""Correct: one for loop over the loader with enumerate, the clock read between batches, stopped after n_iters."""
import time


def wait_times(loader, n_iters):
    first_s, waits = None, []
    t = time.perf_counter()
    for i, _ in enumerate(loader):
        now = time.perf_counter()
        if i == 0:
            first_s = now - t
        else:
            waits.append(now - t)
        if i + 1 == n_iters:
            break
        t = time.perf_counter()
    return first_s, waits
