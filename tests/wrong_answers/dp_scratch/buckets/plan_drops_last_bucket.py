"""Appends a bucket only when it is full: the first parameters, in the last partial bucket, are never planned."""
from dlo.course.dp_scratch_cases import load_script
from dlo.runtime.paths import ROOT

SOURCE = load_script(ROOT / "Jour2" / "dp_scratch_train.py")
BucketedGradSync = SOURCE["BucketedGradSync"]
EXPECT = "partial bucket is missing"


def plan_buckets(params, bucket_bytes):
    buckets, current, size = [], [], 0
    for i in reversed(range(len(params))):
        current.append(i)
        size += params[i].numel() * params[i].element_size()
        if size >= bucket_bytes:
            buckets.append(current)
            current, size = [], 0
    return buckets
