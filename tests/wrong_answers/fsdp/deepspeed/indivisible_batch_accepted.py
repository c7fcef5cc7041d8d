"""Divides the batch with // and never checks it: 5 sequences on 2 ranks silently become 2 per rank (4 in all)."""

EXPECT = "world size must divide"


def deepspeed_config(stage, global_batch, world_size, precision="fp32"):
    if stage not in (1, 2, 3):
        raise ValueError(f"ZeRO stage must be 1, 2 or 3, got {stage}")
    return {"train_batch_size": global_batch, "train_micro_batch_size_per_gpu": global_batch // world_size,
            "gradient_accumulation_steps": 1, "zero_optimization": {"stage": stage},
            "bf16": {"enabled": precision == "bf16"}}
