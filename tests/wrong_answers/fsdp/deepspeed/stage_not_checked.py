"""Accepts any ZeRO stage: stage 4 does not exist."""
import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

EXPECT = 'ValueError'


def deepspeed_config(stage, global_batch, world_size, precision="fp32"):
    return {"zero_optimization": {"stage": stage}, "train_batch_size": global_batch,
            "train_micro_batch_size_per_gpu": global_batch // world_size, "gradient_accumulation_steps": 1,
            "bf16": {"enabled": precision == "bf16"}}
