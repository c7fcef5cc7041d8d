"""Correct: perf_counter imported by name, a timestamp after each batch, the waits taken as differences."""
from time import perf_counter


def wait_times(loader, n_iters):
    stamps = [perf_counter()]
    it = iter(loader)
    for _ in range(n_iters):
        next(it)
        stamps.append(perf_counter())
    return stamps[1] - stamps[0], [b - a for a, b in zip(stamps[1:], stamps[2:])]
