"""Family: inputs that never reach the mistake (a curve that only rises has best == last). Returns the best
accuracy seen instead of the last one: the trial's value would not be the model it ends with."""
import optuna

EXPECT = "that is the best one"


def train_and_report(trial, trainer, epochs):
    best = 0.0
    for epoch in range(1, epochs + 1):
        accuracy = trainer.train_epoch()
        best = max(best, accuracy)
        trial.report(accuracy, step=epoch)
        if trial.should_prune():
            raise optuna.TrialPruned()
    return best
