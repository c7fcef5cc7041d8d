"""Correct: a table of the known names, a KeyError turned into a ValueError."""
import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP


POLICIES = {"fp32": lambda: None,
            "bf16": lambda: MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)}


def mixed_precision_policy(precision):
    try:
        make = POLICIES[precision]
    except KeyError:
        raise ValueError(f"unknown precision {precision!r}") from None
    return make()
