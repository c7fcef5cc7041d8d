"""Samples the learning rate on a linear scale: almost every trial gets lr > 0.1."""
import optuna
import torch

EXPECT = 'sample it on a log scale'


def search_space(trial):
    return {
        "lr": trial.suggest_float("lr", 1e-4, 1.0),
        "weight_decay": trial.suggest_float("weight_decay", 1e-6, 1e-2, log=True),
        "momentum": trial.suggest_float("momentum", 0.0, 0.99),
    }
