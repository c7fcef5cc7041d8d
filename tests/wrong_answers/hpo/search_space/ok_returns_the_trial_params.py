"""Correct: the suggestions in a loop over a table, the trial's own params returned."""
SPACE = [("momentum", 0.0, 0.99, False), ("lr", 1e-4, 1.0, True), ("weight_decay", 1e-6, 1e-2, True)]


def search_space(trial):
    for name, low, high, log in SPACE:
        trial.suggest_float(name, low, high, log=log)
    return dict(trial.params)
