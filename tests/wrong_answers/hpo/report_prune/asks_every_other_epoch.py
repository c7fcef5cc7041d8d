"""Family: a flag set but the behaviour wrong. Asks the pruner only after even epochs ("to save time"): how often
to judge is the pruner's interval_steps, and a trial it stops after an odd epoch trains on."""
import optuna

EXPECT = "after each report"


def train_and_report(trial, trainer, epochs):
    accuracy = float("nan")
    for epoch in range(1, epochs + 1):
        accuracy = trainer.train_epoch()
        trial.report(accuracy, step=epoch)
        if epoch % 2 == 0 and trial.should_prune():
            raise optuna.TrialPruned()
    return accuracy
