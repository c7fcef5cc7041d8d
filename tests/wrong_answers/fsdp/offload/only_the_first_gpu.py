"""Family: inputs that never reach the mistake. Offloads only for the first GPU (compares the device with cuda:0):
right for the process of local rank 0, but every other process of a multi-GPU run is refused."""
import torch
from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

EXPECT = ["offload_policy(cuda:1, True)", "device argument"]


def offload_policy(device, enabled):
    if not enabled:
        return OffloadPolicy()
    if torch.device(device) != torch.device("cuda", 0):
        raise ValueError(f"nothing to offload on {device}")
    return CPUOffloadPolicy(pin_memory=True)
