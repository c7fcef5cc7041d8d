"""Family: what is returned. The list is filled after the loop, with the last call's time only."""
import time

EXPECT = "only the last call"


def time_step(step, sync, warmup, repeats):
    for _ in range(warmup):
        step()
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        step()
        sync()
        elapsed = time.perf_counter() - t0
    return [elapsed]
