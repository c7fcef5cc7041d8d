"""Correct: perf_counter_ns imported by name, nanoseconds converted to seconds, warm-up calls synchronised."""
from time import perf_counter_ns


def time_step(step, sync, warmup, repeats):
    for _ in range(warmup):
        step()
        sync()
    out = []
    for _ in range(repeats):
        start = perf_counter_ns()
        step()
        sync()
        out.append((perf_counter_ns() - start) / 1e9)
    return out
