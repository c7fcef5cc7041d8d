"""Correct: time.monotonic and one iterator; the waits appended by a loop over the remaining count."""
import time


def wait_times(loader, n_iters):
    t = time.monotonic()
    batches = iter(loader)
    next(batches)
    first_s = time.monotonic() - t
    waits = []
    for _ in range(1, n_iters):
        t = time.monotonic()
        next(batches)
        waits.append(time.monotonic() - t)
    return first_s, waits
