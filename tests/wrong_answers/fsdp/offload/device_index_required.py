"""Family: inputs that never reach the mistake. Recognises a GPU by the text 'cuda:' of the device: a device given
without an index (torch.device('cuda'), the current GPU) is refused as if it were the CPU."""
import torch
from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

EXPECT = ["offload_policy(cuda, True)", "device argument"]


def offload_policy(device, enabled):
    if not enabled:
        return OffloadPolicy()
    if not str(device).startswith("cuda:"):
        raise ValueError(f"CPU offload needs a GPU, this run trains on {device}")
    return CPUOffloadPolicy(pin_memory=True)
