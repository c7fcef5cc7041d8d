"""Family: unknown inputs silently mapped. Refuses only stages above 3: stage 0 (no ZeRO at all) and negative
stages go through as if they were ZeRO stages."""
import torch

EXPECT = ["deepspeed_config(0, 8, 2", "ZeRO has no stage 0"]


def deepspeed_config(stage, global_batch, world_size, precision="fp32"):
    if stage > 3:
        raise ValueError(f"ZeRO stage must be at most 3, got {stage!r}")
    if global_batch % world_size:
        raise ValueError(f"{world_size} ranks cannot share a batch of {global_batch}")
    return {"train_batch_size": global_batch, "train_micro_batch_size_per_gpu": global_batch // world_size,
            "gradient_accumulation_steps": 1, "zero_optimization": {"stage": stage},
            "bf16": {"enabled": precision == "bf16"}}
