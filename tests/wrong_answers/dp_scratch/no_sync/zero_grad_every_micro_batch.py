"""Zeroes the gradients before every micro-batch: only the last one's gradient is left to step with."""
import contextlib

from dlo.course.dp_scratch_cases import load_script
from dlo.runtime.paths import ROOT

SOURCE = load_script(ROOT / "Jour2" / "dp_scratch_train.py")
GradSync = SOURCE["GradSync"]
EXPECT = "zero the gradients once, before the loop"


def train_step_accumulated(model, sync, micro_batches, criterion, optimizer):
    k = len(micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        optimizer.zero_grad(set_to_none=True)
        with sync.no_sync() if i < k - 1 else contextlib.nullcontext():
            loss = criterion(model(x), y) / k
            loss.backward()
    sync.finish()
    optimizer.step()
    return loss.detach()
