"""Family: a flag set but the behaviour wrong. Asks should_prune() before reporting the epoch: the pruner judges the
previous epoch, and the trial trains one epoch too many."""
import optuna

EXPECT = "after each report"


def train_and_report(trial, trainer, epochs):
    accuracy = None
    for epoch in range(1, epochs + 1):
        if trial.should_prune():
            raise optuna.TrialPruned()
        accuracy = trainer.train_epoch()
        trial.report(accuracy, step=epoch)
    return accuracy
