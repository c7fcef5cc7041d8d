"""Keeps the buckets but all-reduces each gradient on its own: as many messages as without buckets."""
import torch.distributed as dist

from dlo.course.dp_scratch_cases import load_script
from dlo.runtime.paths import ROOT

SOURCE = load_script(ROOT / "Jour2" / "dp_scratch_train.py")
GradSync, plan_buckets = SOURCE["GradSync"], SOURCE["plan_buckets"]
EXPECT = "one all-reduce per parameter"


class BucketedGradSync(SOURCE["BucketedGradSync"]):
    def _on_grad_ready(self, param):
        if self.require_sync:
            self.pending.append((param, dist.all_reduce(param.grad, async_op=True)))

    def finish(self):
        for param, handle in self.pending:
            handle.wait()
            param.grad.div_(dist.get_world_size())
        self.pending.clear()
