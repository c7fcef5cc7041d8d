"""Family: synchronisation. Waits after each timed call, but not before the first one starts: the warm-up's work
still queued on the device lands in the first time."""
import time

EXPECT = "no sync before starting the clock"


def time_step(step, sync, warmup, repeats):
    for _ in range(warmup):
        step()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t0)
    return times
