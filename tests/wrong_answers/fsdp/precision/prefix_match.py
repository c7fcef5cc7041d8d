"""Matches on the prefix: any name starting with "bf" is bf16, so a typo ("bf61") trains in bf16. Family: unknown inputs silently mapped."""
import torch
from torch.distributed.fsdp import MixedPrecisionPolicy

EXPECT = ["'bf61'", 'ValueError']


def mixed_precision_policy(precision):
    if precision == "fp32":
        return None
    if str(precision).startswith("bf"):
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    raise ValueError(f"unknown precision {precision!r}")
