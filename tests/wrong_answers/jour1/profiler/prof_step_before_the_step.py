"""Calls prof.step() before each step instead of after it: the schedule moves one step early, so the trace holds
the last warm-up step and misses the last active one. Family: the right calls, counted the right number of times,
in the wrong order."""
import torch

EXPECT = ["the trace holds steps [0]", "steps [1] are missing"]


def profile_steps(step, trace_dir, wait=1, warmup=1, active=3):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                schedule=torch.profiler.schedule(wait=wait, warmup=warmup, active=active),
                                on_trace_ready=torch.profiler.tensorboard_trace_handler(str(trace_dir))) as prof:
        for _ in range(wait + warmup + active):
            prof.step()
            step()
    return prof
