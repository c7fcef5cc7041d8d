"""Launches each full bucket asynchronously but waits for it in the hook: backward stalls on every bucket."""
import torch.distributed as dist

from dlo.course.dp_scratch_cases import load_script
from dlo.runtime.paths import ROOT

SOURCE = load_script(ROOT / "Jour2" / "dp_scratch_train.py")
plan_buckets = SOURCE["plan_buckets"]
EXPECT = ["waited for inside the hook", "nothing overlaps backward"]


class BucketedGradSync(SOURCE["BucketedGradSync"]):
    def _on_grad_ready(self, param):
        if not self.require_sync:
            return
        b, offset = self.slot[self.index[id(param)]]
        self.buffers[b][offset:offset + param.numel()].copy_(param.grad.reshape(-1))
        self.ready[b] += 1
        if self.ready[b] == len(self.plan[b]):
            dist.all_reduce(self.buffers[b], async_op=True).wait()
            self.pending.append((b, None))

    def finish(self):
        world = dist.get_world_size()
        for b, _ in self.pending:
            self.buffers[b].div_(world)
            for i in self.plan[b]:
                p = self.params[i]
                offset = self.slot[i][1]
                p.grad.copy_(self.buffers[b][offset:offset + p.numel()].view_as(p))
        self.pending.clear()
        self.ready = [0] * len(self.plan)
