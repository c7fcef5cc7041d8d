"""Runs only `active` steps: the schedule's wait and warm-up steps never happen, nothing is recorded."""
import torch

EXPECT = ["ran 1 time:", "wait + warmup + active = 2 steps"]


def profile_steps(step, trace_dir, wait=1, warmup=1, active=3):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                schedule=torch.profiler.schedule(wait=wait, warmup=warmup, active=active),
                                on_trace_ready=torch.profiler.tensorboard_trace_handler(str(trace_dir))) as prof:
        for _ in range(active):
            step()
            prof.step()
    return prof
