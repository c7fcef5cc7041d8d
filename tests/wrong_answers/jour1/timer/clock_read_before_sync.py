"""Family: synchronisation. Syncs, but reads the end of the clock just before the sync, not after it."""
import time

EXPECT = ["read before sync", "launch"]


def time_step(step, sync, warmup, repeats):
    for _ in range(warmup):
        step()
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        step()
        t1 = time.perf_counter()
        sync()
        times.append(t1 - t0)
    return times
