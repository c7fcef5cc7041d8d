"""Counts every element as 4 bytes (float32): bf16 and fp16 gradients take 2, fp64 ones 8."""
from dlo.course.dp_scratch_cases import load_script
from dlo.runtime.paths import ROOT

SOURCE = load_script(ROOT / "Jour2" / "dp_scratch_train.py")
BucketedGradSync = SOURCE["BucketedGradSync"]
EXPECT = ["4-byte elements", "element_size()"]


def plan_buckets(params, bucket_bytes):
    buckets, current, size = [], [], 0
    for i in reversed(range(len(params))):
        current.append(i)
        size += params[i].numel() * 4
        if size >= bucket_bytes:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets
