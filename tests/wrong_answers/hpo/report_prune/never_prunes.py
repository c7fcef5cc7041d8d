"""Reports every epoch but never asks the pruner: bad trials run to the end."""
import optuna
import torch

EXPECT = 'after each report'


def train_and_report(trial, trainer, epochs):
    accuracy = float("nan")
    for epoch in range(1, epochs + 1):
        accuracy = trainer.train_epoch()
        trial.report(accuracy, step=epoch)
    return accuracy
