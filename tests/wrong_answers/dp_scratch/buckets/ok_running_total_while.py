"""Correct: DDP's buckets built with a while loop from the last parameter, the bytes of each gradient from
nbytes-like arithmetic (numel times element_size), the last bucket kept even when smaller."""
from dlo.course.dp_scratch_cases import load_script
from dlo.runtime.paths import ROOT

BucketedGradSync = load_script(ROOT / "Jour2" / "dp_scratch_train.py")["BucketedGradSync"]


def plan_buckets(params, bucket_bytes):
    plan, bucket, filled = [], [], 0
    i = len(params) - 1
    while i >= 0:
        bucket.append(i)
        filled += params[i].numel() * params[i].element_size()
        if filled >= bucket_bytes:
            plan.append(bucket)
            bucket, filled = [], 0
        i -= 1
    return plan + ([bucket] if bucket else [])
