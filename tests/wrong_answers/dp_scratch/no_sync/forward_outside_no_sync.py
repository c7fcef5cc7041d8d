"""Wraps only the backward in no_sync(): fine for hooks that read the flag at backward time, but DDP arms its
all-reduces during the forward, so under DDP every micro-batch still communicates."""
import contextlib

from dlo.course.dp_scratch_cases import load_script
from dlo.runtime.paths import ROOT

SOURCE = load_script(ROOT / "Jour2" / "dp_scratch_train.py")
GradSync = SOURCE["GradSync"]
EXPECT = "forward"


def train_step_accumulated(model, sync, micro_batches, criterion, optimizer):
    k = len(micro_batches)
    optimizer.zero_grad(set_to_none=True)
    total = 0.0
    for i, (x, y) in enumerate(micro_batches):
        loss = criterion(model(x), y) / k
        with sync.no_sync() if i < k - 1 else contextlib.nullcontext():
            loss.backward()
        total += loss.item()
    sync.finish()
    optimizer.step()
    return total
