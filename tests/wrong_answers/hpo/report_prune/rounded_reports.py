"""Family: part of the result right (accuracies with two decimals look the same). Reports the accuracy rounded to
two decimals: the pruner compares rounded values with the other trials' exact ones."""
import optuna

EXPECT = "the trial holds"


def train_and_report(trial, trainer, epochs):
    accuracy = float("nan")
    for epoch in range(1, epochs + 1):
        accuracy = trainer.train_epoch()
        trial.report(round(accuracy, 2), step=epoch)
        if trial.should_prune():
            raise optuna.TrialPruned()
    return accuracy
