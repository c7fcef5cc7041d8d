"""Accumulates without no_sync(): every micro-batch's backward all-reduces, k times the communication for one step."""
from dlo.course.dp_scratch_cases import load_script
from dlo.runtime.paths import ROOT

SOURCE = load_script(ROOT / "Jour2" / "dp_scratch_train.py")
GradSync = SOURCE["GradSync"]
EXPECT = "every micro-batch"


def train_step_accumulated(model, sync, micro_batches, criterion, optimizer):
    k = len(micro_batches)
    optimizer.zero_grad(set_to_none=True)
    for x, y in micro_batches:
        loss = criterion(model(x), y) / k
        loss.backward()
    sync.finish()
    optimizer.step()
    return loss.detach()
