"""Correct: a zero-based loop that reports at epoch + 1, the last accuracy kept in a list, the pruning exception
imported from optuna.exceptions."""
from optuna.exceptions import TrialPruned


def train_and_report(trial, trainer, epochs):
    history = []
    for epoch in range(epochs):
        history.append(trainer.train_epoch())
        trial.report(history[-1], epoch + 1)
        if trial.should_prune():
            raise TrialPruned()
    return history[-1]
