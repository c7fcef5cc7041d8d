"""Launches a bucket once it holds bucket_bytes: the last, smaller bucket never gets there and is never sent."""
import torch.distributed as dist

from dlo.course.dp_scratch_cases import load_script
from dlo.runtime.paths import ROOT

SOURCE = load_script(ROOT / "Jour2" / "dp_scratch_train.py")
GradSync, plan_buckets = SOURCE["GradSync"], SOURCE["plan_buckets"]
EXPECT = "partial bucket was never all-reduced"


class BucketedGradSync(SOURCE["BucketedGradSync"]):
    def __init__(self, model, bucket_bytes):
        super().__init__(model, bucket_bytes)
        self.bucket_bytes = bucket_bytes
        self.filled = [0] * len(self.plan)

    def _on_grad_ready(self, param):
        if not self.require_sync:
            return
        b, offset = self.slot[self.index[id(param)]]
        self.buffers[b][offset:offset + param.numel()].copy_(param.grad.reshape(-1))
        self.filled[b] += param.numel() * param.element_size()
        if self.filled[b] >= self.bucket_bytes:
            self.pending.append((b, dist.all_reduce(self.buffers[b], async_op=True)))

    def finish(self):
        super().finish()
        self.filled = [0] * len(self.plan)
