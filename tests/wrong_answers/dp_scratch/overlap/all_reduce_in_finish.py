"""The hooks only note which gradients are ready; finish() launches the all-reduces, after backward: no overlap."""
import torch.distributed as dist

from dlo.course.dp_scratch_cases import load_script
from dlo.runtime.paths import ROOT

GradSync = load_script(ROOT / "Jour2" / "dp_scratch_train.py")["GradSync"]
EXPECT = "after backward"


class OverlappedGradSync(GradSync):
    def __init__(self, model):
        super().__init__(model)
        self.pending = []
        for p in model.parameters():
            self.hook_handles.append(p.register_post_accumulate_grad_hook(self._on_grad_ready))

    def _on_grad_ready(self, param):
        if self.require_sync:
            self.pending.append(param.grad)

    def finish(self):
        works = [(dist.all_reduce(g, async_op=True), g) for g in self.pending]
        for work, grad in works:
            work.wait()
            grad.div_(dist.get_world_size())
        self.pending.clear()
