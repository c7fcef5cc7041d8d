"""Family: inputs that never reach the mistake (every case of four epochs). Loops over the notebook's EPOCHS instead
of the epochs passed in: a study run with another number of epochs trains the wrong number."""
import optuna

EPOCHS = 4
EXPECT = "the number of epochs given"


def train_and_report(trial, trainer, epochs):
    accuracy = float("nan")
    for epoch in range(1, EPOCHS + 1):
        accuracy = trainer.train_epoch()
        trial.report(accuracy, step=epoch)
        if trial.should_prune():
            raise optuna.TrialPruned()
    return accuracy
