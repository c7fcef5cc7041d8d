"""Family: what is returned. The clock starts once before the loop: each time includes every call before it."""
import time

EXPECT = "started once"


def time_step(step, sync, warmup, repeats):
    for _ in range(warmup):
        step()
    sync()
    t0 = time.perf_counter()
    times = []
    for _ in range(repeats):
        step()
        sync()
        times.append(time.perf_counter() - t0)
    return times
