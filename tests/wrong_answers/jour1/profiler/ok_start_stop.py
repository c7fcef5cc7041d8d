"""Correct: the profiler started and stopped by hand instead of a with block."""
import torch


def profile_steps(step, trace_dir, wait=1, warmup=1, active=3):
    prof = torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        schedule=torch.profiler.schedule(wait=wait, warmup=warmup, active=active, repeat=1),
        on_trace_ready=torch.profiler.tensorboard_trace_handler(str(trace_dir)),
    )
    prof.start()
    try:
        for _ in range(wait + warmup + active):
            step()
            prof.step()
    finally:
        prof.stop()
    return prof
