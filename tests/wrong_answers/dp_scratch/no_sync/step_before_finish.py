"""Takes the optimizer step before sync.finish(): each rank steps with its own accumulated gradient, then the
averages arrive too late. The ranks drift apart."""
import contextlib

from dlo.course.dp_scratch_cases import load_script
from dlo.runtime.paths import ROOT

GradSync = load_script(ROOT / "Jour2" / "dp_scratch_train.py")["GradSync"]
EXPECT = ["optimizer stepped before the gradients were averaged", "weights differ"]


def train_step_accumulated(model, sync, micro_batches, criterion, optimizer):
    k = len(micro_batches)
    optimizer.zero_grad(set_to_none=True)
    total = 0.0
    for i, (x, y) in enumerate(micro_batches):
        with sync.no_sync() if i < k - 1 else contextlib.nullcontext():
            loss = criterion(model(x), y) / k
            loss.backward()
        total += loss.item()
    optimizer.step()
    sync.finish()
    return total
