"""Samples lr and weight_decay under the same name: they are tied to one value."""
import optuna
import torch

EXPECT = 'its own name'


def search_space(trial):
    lr = trial.suggest_float("lr", 1e-4, 1.0, log=True)
    return {
        "lr": lr,
        "weight_decay": trial.suggest_float("lr", 1e-4, 1.0, log=True),
        "momentum": trial.suggest_float("momentum", 0.0, 0.99),
    }
