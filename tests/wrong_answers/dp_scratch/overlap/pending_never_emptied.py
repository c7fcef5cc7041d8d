"""finish() never empties the list of handles: each step waits for and divides every earlier step's gradients again."""
import torch.distributed as dist

from dlo.course.dp_scratch_cases import load_script
from dlo.runtime.paths import ROOT

GradSync = load_script(ROOT / "Jour2" / "dp_scratch_train.py")["GradSync"]
EXPECT = ["self.pending", "empty"]


class OverlappedGradSync(GradSync):
    def __init__(self, model):
        super().__init__(model)
        self.pending = []
        for p in model.parameters():
            self.hook_handles.append(p.register_post_accumulate_grad_hook(self._on_grad_ready))

    def _on_grad_ready(self, param):
        if self.require_sync:
            self.pending.append((dist.all_reduce(param.grad, async_op=True), param.grad))

    def finish(self):
        for work, grad in self.pending:
            work.wait()
            grad.div_(dist.get_world_size())
