"""Family: inputs that never reach the mistake (a curve that only rises). Reports the running best: the pruner
never sees the epoch whose accuracy dropped."""
import optuna

EXPECT = "best accuracy so far"


def train_and_report(trial, trainer, epochs):
    best = 0.0
    accuracy = best
    for epoch in range(1, epochs + 1):
        accuracy = trainer.train_epoch()
        best = max(best, accuracy)
        trial.report(best, step=epoch)
        if trial.should_prune():
            raise optuna.TrialPruned()
    return accuracy
