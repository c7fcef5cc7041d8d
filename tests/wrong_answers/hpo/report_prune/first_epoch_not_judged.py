"""Family: inputs that never reach the mistake (no trial bad enough to stop after one epoch). Skips the pruner's
question after the first epoch ("one epoch says nothing yet"): the warm-up is the pruner's setting
(n_warmup_steps), and a trial the pruner would stop at once trains on."""
import optuna

EXPECT = "after each report"


def train_and_report(trial, trainer, epochs):
    accuracy = float("nan")
    for epoch in range(1, epochs + 1):
        accuracy = trainer.train_epoch()
        trial.report(accuracy, step=epoch)
        if epoch > 1 and trial.should_prune():
            raise optuna.TrialPruned()
    return accuracy
