"""Correct: a match statement, the wildcard case refusing every other name."""
import torch
from torch.distributed.fsdp import MixedPrecisionPolicy


def mixed_precision_policy(precision):
    match precision:
        case "fp32":
            return None
        case "bf16":
            return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        case _:
            raise ValueError(f"precision must be 'fp32' or 'bf16', got {precision!r}")
