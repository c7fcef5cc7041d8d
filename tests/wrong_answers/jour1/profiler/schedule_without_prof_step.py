"""Passes a schedule but never calls prof.step(): the schedule never advances."""
import torch

EXPECT = 'after each step'


def profile_steps(step, trace_dir, wait=1, warmup=1, active=3):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                schedule=torch.profiler.schedule(wait=wait, warmup=warmup, active=active),
                                on_trace_ready=torch.profiler.tensorboard_trace_handler(str(trace_dir))) as prof:
        for _ in range(wait + warmup + active):
            step()
    return prof
