"""Does not divide the micro-batch losses by k: the accumulated gradient is k times the big batch's."""
import contextlib

from dlo.course.dp_scratch_cases import load_script
from dlo.runtime.paths import ROOT

SOURCE = load_script(ROOT / "Jour2" / "dp_scratch_train.py")
GradSync = SOURCE["GradSync"]
EXPECT = ["too large", "divided by k"]


def train_step_accumulated(model, sync, micro_batches, criterion, optimizer):
    k = len(micro_batches)
    optimizer.zero_grad(set_to_none=True)
    for i, (x, y) in enumerate(micro_batches):
        with sync.no_sync() if i < k - 1 else contextlib.nullcontext():
            loss = criterion(model(x), y)
            loss.backward()
    sync.finish()
    optimizer.step()
    return loss.detach()
