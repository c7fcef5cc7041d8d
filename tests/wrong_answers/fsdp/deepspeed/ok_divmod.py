"""Correct: the per-rank batch from divmod, with its own error when the world size does not divide the batch."""
import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP


def deepspeed_config(stage, global_batch, world_size, precision="fp32"):
    if stage not in {1, 2, 3}:
        raise ValueError(f"no ZeRO stage {stage}")
    micro, rest = divmod(global_batch, world_size)
    if rest or micro < 1:
        raise ValueError(f"{world_size} ranks cannot share a batch of {global_batch}")
    config = {"zero_optimization": {"stage": stage}, "train_batch_size": global_batch}
    config["train_micro_batch_size_per_gpu"] = micro
    config["gradient_accumulation_steps"] = 1
    config["bf16"] = {"enabled": precision == "bf16"}
    return config
