"""Family: warm-up. Runs warmup + repeats calls but times them all and returns them all."""
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
    return times
