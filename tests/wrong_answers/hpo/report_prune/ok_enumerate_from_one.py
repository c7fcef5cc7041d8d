"""Correct: enumerate over the epochs from 1, the step passed by keyword, the pruning raised through optuna's
exceptions module without a message."""
import optuna


def train_and_report(trial, trainer, epochs):
    accuracy = float("nan")
    for epoch, _ in enumerate(range(epochs), start=1):
        accuracy = trainer.train_epoch()
        trial.report(value=accuracy, step=epoch)
        if trial.should_prune():
            raise optuna.exceptions.TrialPruned()
    return accuracy
