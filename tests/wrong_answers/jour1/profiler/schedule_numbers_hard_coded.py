"""Writes schedule(wait=1, warmup=1, active=2) whatever the arguments say."""
import torch

EXPECT = ["the trace holds steps", "asks for the 1 active ones, [1]", "missing"]


def profile_steps(step, trace_dir, wait=1, warmup=1, active=3):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                schedule=torch.profiler.schedule(wait=1, warmup=1, active=2),
                                on_trace_ready=torch.profiler.tensorboard_trace_handler(str(trace_dir))) as prof:
        for _ in range(wait + warmup + active):
            step()
            prof.step()
    return prof
