"""An empty or missing name taken as the default, fp32. Family: unknown inputs silently mapped."""
import torch
from torch.distributed.fsdp import MixedPrecisionPolicy

EXPECT = ["''", 'ValueError']


def mixed_precision_policy(precision):
    if not precision or precision == "fp32":
        return None
    if precision == "bf16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    raise ValueError(f"unknown precision {precision!r}")
