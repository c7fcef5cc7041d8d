"""None taken as fp32 (as if the argument had a default): a configuration that forgot the field trains in fp32 without a word. Family: unknown inputs silently mapped."""
import torch
from torch.distributed.fsdp import MixedPrecisionPolicy

EXPECT = ['None', 'ValueError']


def mixed_precision_policy(precision):
    if precision in (None, "fp32"):
        return None
    if precision == "bf16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    raise ValueError(f"unknown precision {precision!r}")
