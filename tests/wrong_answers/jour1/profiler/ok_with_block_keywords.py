"""Correct: a with block, the schedule built with keywords, the trace handler named as on_trace_ready, the CPU and
(where there is one) the GPU recorded, the steps counted by a while loop."""
import torch
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler


def profile_steps(step, trace_dir, wait=1, warmup=1, active=3):
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities, schedule=schedule(wait=wait, warmup=warmup, active=active),
                 on_trace_ready=tensorboard_trace_handler(str(trace_dir))) as prof:
        done = 0
        while done < wait + warmup + active:
            step()
            prof.step()
            done += 1
    return prof
