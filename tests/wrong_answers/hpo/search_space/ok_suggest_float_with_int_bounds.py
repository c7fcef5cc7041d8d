"""Correct: integer bounds where they are whole numbers (0 and 1 are read as floats by suggest_float), the
dictionary filled one key at a time."""


def search_space(trial):
    space = {}
    space["momentum"] = trial.suggest_float("momentum", 0, 0.99, log=False)
    space["lr"] = trial.suggest_float("lr", 0.0001, 1, log=True)
    space["weight_decay"] = trial.suggest_float("weight_decay", 0.000001, 0.01, log=True)
    return space
