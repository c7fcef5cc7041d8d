"""Launches with async_op=True but waits for the handle at once, inside the hook: backward stops at every
gradient until its all-reduce is done, exactly as with a blocking call."""
import torch.distributed as dist

from dlo.course.dp_scratch_cases import load_script
from dlo.runtime.paths import ROOT

GradSync = load_script(ROOT / "Jour2" / "dp_scratch_train.py")["GradSync"]
EXPECT = ["waited for inside the hook", "nothing overlaps backward"]


class OverlappedGradSync(GradSync):
    def __init__(self, model):
        super().__init__(model)
        self.pending = []
        for p in model.parameters():
            if p.requires_grad:
                self.hook_handles.append(p.register_post_accumulate_grad_hook(self._on_grad_ready))

    def _on_grad_ready(self, param):
        if self.require_sync:
            handle = dist.all_reduce(param.grad, async_op=True)
            handle.wait()
            param.grad.div_(dist.get_world_size())

    def finish(self):
        pass
