"""Family: a flag set but the behaviour wrong. Stops when told to, but returns the accuracy instead of raising:
Optuna records a complete trial with a half-trained score."""
import optuna

EXPECT = "TrialPruned"


def train_and_report(trial, trainer, epochs):
    accuracy = 0.0
    for epoch in range(1, epochs + 1):
        accuracy = trainer.train_epoch()
        trial.report(accuracy, step=epoch)
        if trial.should_prune():
            return accuracy
    return accuracy
