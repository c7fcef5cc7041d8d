"""Runs all k micro-batches inside no_sync(): nothing is ever communicated, each rank steps with its own gradient."""
from dlo.course.dp_scratch_cases import load_script
from dlo.runtime.paths import ROOT

SOURCE = load_script(ROOT / "Jour2" / "dp_scratch_train.py")
GradSync = SOURCE["GradSync"]
EXPECT = "outside no_sync()"


def train_step_accumulated(model, sync, micro_batches, criterion, optimizer):
    k = len(micro_batches)
    optimizer.zero_grad(set_to_none=True)
    with sync.no_sync():
        for x, y in micro_batches:
            loss = criterion(model(x), y) / k
            loss.backward()
    sync.finish()
    optimizer.step()
    return loss.detach()
