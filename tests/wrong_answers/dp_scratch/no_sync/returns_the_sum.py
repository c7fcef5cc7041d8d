"""Adds up the undivided losses for the report: k times the mean."""
import contextlib

from dlo.course.dp_scratch_cases import load_script
from dlo.runtime.paths import ROOT

GradSync = load_script(ROOT / "Jour2" / "dp_scratch_train.py")["GradSync"]
EXPECT = ["returned loss", "k times the mean"]


def train_step_accumulated(model, sync, micro_batches, criterion, optimizer):
    k = len(micro_batches)
    optimizer.zero_grad(set_to_none=True)
    total = 0.0
    for i, (x, y) in enumerate(micro_batches):
        with sync.no_sync() if i < k - 1 else contextlib.nullcontext():
            loss = criterion(model(x), y)
            (loss / k).backward()
        total += loss.item()
    sync.finish()
    optimizer.step()
    return total
