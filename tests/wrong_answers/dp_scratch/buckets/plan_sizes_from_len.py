"""Inputs that never reach the mistake: a tensor's size taken as len(t) * element_size(), its first dimension only:
right for vectors (biases, and every tensor of a plan asked with 1-D tensors only), too small for weight matrices."""
from dlo.course.dp_scratch_cases import load_script
from dlo.runtime.paths import ROOT

SOURCE = load_script(ROOT / "Jour2" / "dp_scratch_train.py")
BucketedGradSync = SOURCE["BucketedGradSync"]
EXPECT = "plan_buckets(tensors of"


def plan_buckets(params, bucket_bytes):
    buckets, current, size = [], [], 0
    for i in reversed(range(len(params))):
        current.append(i)
        size += len(params[i]) * params[i].element_size()
        if size >= bucket_bytes:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets
