"""Family: warm-up. Times every call from the first: the one-off costs (allocation, autotuning) are in the times."""
import time

EXPECT = "no warm-up"


def time_step(step, sync, warmup, repeats):
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t0)
    return times
