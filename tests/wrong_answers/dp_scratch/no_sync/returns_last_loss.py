"""Returns the last micro-batch's loss as the step's loss: the gradients are right, the number reported is not."""
import contextlib

from dlo.course.dp_scratch_cases import load_script
from dlo.runtime.paths import ROOT

GradSync = load_script(ROOT / "Jour2" / "dp_scratch_train.py")["GradSync"]
EXPECT = ["returned loss", "last micro-batch"]


def train_step_accumulated(model, sync, micro_batches, criterion, optimizer):
    k = len(micro_batches)
    optimizer.zero_grad(set_to_none=True)
    for i, (x, y) in enumerate(micro_batches):
        with sync.no_sync() if i < k - 1 else contextlib.nullcontext():
            loss = criterion(model(x), y)
            (loss / k).backward()
    sync.finish()
    optimizer.step()
    return loss.detach()
