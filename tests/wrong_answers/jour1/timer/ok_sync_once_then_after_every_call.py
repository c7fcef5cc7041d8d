"""Correct: one sync after the warm-up, then a sync after every timed call (the device is idle at each start)."""
import time


def time_step(step, sync, warmup, repeats):
    for _ in range(warmup):
        step()
    sync()
    times = []
    end = time.perf_counter()
    for _ in range(repeats):
        start = end
        step()
        sync()
        end = time.perf_counter()
        times.append(end - start)
    return times
