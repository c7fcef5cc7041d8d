"""Correct: DDP's buckets, with the indices of each bucket listed in increasing order (the order inside a bucket
only decides where each gradient sits in the flat buffer)."""
from dlo.course.dp_scratch_cases import load_script
from dlo.runtime.paths import ROOT

SOURCE = load_script(ROOT / "Jour2" / "dp_scratch_train.py")
BucketedGradSync = SOURCE["BucketedGradSync"]


def plan_buckets(params, bucket_bytes):
    buckets, current, size = [], [], 0
    for i in range(len(params) - 1, -1, -1):
        current.append(i)
        size += params[i].numel() * params[i].element_size()
        if size >= bucket_bytes:
            buckets.append(sorted(current))
            current, size = [], 0
    if current:
        buckets.append(sorted(current))
    return buckets
