"""Correct: the bucket plan built from Tensor.nbytes, the indices walked from the end with a while loop, each bucket
listed in registration order (the order inside a bucket is free)."""
from dlo.course.dp_scratch_cases import load_script
from dlo.runtime.paths import ROOT

SOURCE = load_script(ROOT / "Jour2" / "dp_scratch_train.py")
BucketedGradSync = SOURCE["BucketedGradSync"]


def plan_buckets(params, bucket_bytes):
    plan, bucket, filled = [], [], 0
    i = len(params) - 1
    while i >= 0:
        bucket.insert(0, i)
        filled += params[i].nbytes
        if filled >= bucket_bytes:
            plan.append(bucket)
            bucket, filled = [], 0
        i -= 1
    if bucket:
        plan.append(bucket)
    return plan
