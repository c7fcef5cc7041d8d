"""Family: units. perf_counter_ns differences returned as they are: nanoseconds, not seconds."""
import time

EXPECT = "nanoseconds"


def time_step(step, sync, warmup, repeats):
    for _ in range(warmup):
        step()
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter_ns()
        step()
        sync()
        times.append(time.perf_counter_ns() - t0)
    return times
