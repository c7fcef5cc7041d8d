"""Fills the buckets from the first parameter: the first bucket then waits for the end of backward."""
from dlo.course.dp_scratch_cases import load_script
from dlo.runtime.paths import ROOT

SOURCE = load_script(ROOT / "Jour2" / "dp_scratch_train.py")
BucketedGradSync = SOURCE["BucketedGradSync"]
EXPECT = "reverse registration order"


def plan_buckets(params, bucket_bytes):
    buckets, current, size = [], [], 0
    for i in range(len(params)):
        current.append(i)
        size += params[i].numel() * params[i].element_size()
        if size >= bucket_bytes:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets
