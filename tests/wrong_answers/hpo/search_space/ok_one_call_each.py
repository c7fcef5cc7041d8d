"""Correct: one suggest_float call per hyper-parameter written out, the dictionary built at the end."""


def search_space(trial):
    lr = trial.suggest_float("lr", 1e-4, 1.0, log=True)
    weight_decay = trial.suggest_float("weight_decay", 1e-6, 1e-2, log=True)
    momentum = trial.suggest_float("momentum", 0.0, 0.99)
    return {"lr": lr, "weight_decay": weight_decay, "momentum": momentum}
