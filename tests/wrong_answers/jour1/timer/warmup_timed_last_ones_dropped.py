"""Family: warm-up. Times all warmup + repeats calls and keeps the first `repeats`: the warm-up ones."""
import time

EXPECT = "warm-up calls were timed"


def time_step(step, sync, warmup, repeats):
    times = []
    for _ in range(warmup + repeats):
        sync()
        t0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t0)
    return times[:repeats]
