"""Sets param_dtype only: reduce_dtype=None means "the param_dtype", so gradients are summed over ranks in bf16."""
import torch
from torch.distributed.fsdp import MixedPrecisionPolicy

EXPECT = "reduce_dtype=torch.float32"


def mixed_precision_policy(precision):
    if precision == "fp32":
        return None
    if precision == "bf16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16)
    raise ValueError(f"unknown precision {precision!r}")
