"""Passes the total number of steps as active (wait=0, warmup=0): every step, the slow first ones included, is in
the trace. Family: the schedule's numbers computed from the arguments, not the ones asked for."""
import torch

EXPECT = ["the trace holds steps [0, 1]", "the first steps [0], slow and skipped on purpose"]


def profile_steps(step, trace_dir, wait=1, warmup=1, active=3):
    total = wait + warmup + active
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                schedule=torch.profiler.schedule(wait=0, warmup=0, active=total),
                                on_trace_ready=torch.profiler.tensorboard_trace_handler(str(trace_dir))) as prof:
        for _ in range(total):
            step()
            prof.step()
    return prof
