"""Family: inputs that never reach the mistake. The per-rank batch written for two GPUs (global batch // 2): right
on 2 ranks, wrong on any other world size."""
import torch

EXPECT = ["train_micro_batch_size_per_gpu", "global batch / world size"]


def deepspeed_config(stage, global_batch, world_size, precision="fp32"):
    if stage not in (1, 2, 3):
        raise ValueError(f"ZeRO stage must be 1, 2 or 3, got {stage!r}")
    if global_batch % world_size:
        raise ValueError(f"{world_size} ranks cannot share a batch of {global_batch}")
    return {"train_batch_size": global_batch, "train_micro_batch_size_per_gpu": global_batch // 2,
            "gradient_accumulation_steps": 1, "zero_optimization": {"stage": stage},
            "bf16": {"enabled": precision == "bf16"}}
