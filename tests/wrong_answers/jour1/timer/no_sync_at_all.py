"""Family: synchronisation. Never waits for the device: on a GPU the clock measures the launch of the work."""
import time

EXPECT = ["never waited", "launch"]


def time_step(step, sync, warmup, repeats):
    for _ in range(warmup):
        step()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return times
