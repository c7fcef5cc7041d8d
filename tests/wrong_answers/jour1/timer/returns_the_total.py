"""Family: what is returned. One clock around the whole loop: the total, not one time per call."""
import time

EXPECT = "total time"


def time_step(step, sync, warmup, repeats):
    for _ in range(warmup):
        step()
    sync()
    t0 = time.perf_counter()
    for _ in range(repeats):
        step()
    sync()
    return time.perf_counter() - t0
