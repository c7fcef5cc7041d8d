"""Profiles with the schedule but writes no trace file (no on_trace_ready)."""
import torch

EXPECT = 'no trace file'


def profile_steps(step, trace_dir, wait=1, warmup=1, active=3):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                schedule=torch.profiler.schedule(wait=wait, warmup=warmup, active=active)) as prof:
        for _ in range(wait + warmup + active):
            step()
            prof.step()
    return prof
