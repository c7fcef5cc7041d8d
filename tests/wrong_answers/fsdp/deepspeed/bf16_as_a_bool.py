"""Family: part of the result right. Writes the bf16 switch as a bare boolean: DeepSpeed reads a section with an
'enabled' key, and takes the bare value for no section at all."""
from dlo.data import tokens

import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

EXPECT = "enabled"


def deepspeed_config(stage, global_batch, world_size, precision="fp32"):
    if stage not in (1, 2, 3):
        raise ValueError("stage must be 1, 2 or 3")
    return {"train_batch_size": global_batch,
            "train_micro_batch_size_per_gpu": tokens.per_rank_batch(global_batch, world_size),
            "gradient_accumulation_steps": 1, "zero_optimization": {"stage": stage},
            "bf16": precision == "bf16"}
