"""Correct: a while loop over the epochs, the pruning exception raised with a message."""
import optuna


def train_and_report(trial, trainer, epochs):
    done, last = 0, None
    while done < epochs:
        last = float(trainer.train_epoch())
        done += 1
        trial.report(last, done)
        if trial.should_prune():
            raise optuna.exceptions.TrialPruned(f"stopped after {done} epochs")
    return last
