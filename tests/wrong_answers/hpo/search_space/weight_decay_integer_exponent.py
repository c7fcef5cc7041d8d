"""Family: part of the result right (the same decades). Samples weight decay's exponent as an integer and returns
10 ** exponent: only five values (1e-6 ... 1e-2) are ever tried, and the trial records the exponent."""
EXPECT = "weight_decay: expected a float in [1e-06, 0.01] on a log scale"


def search_space(trial):
    return {
        "lr": trial.suggest_float("lr", 1e-4, 1.0, log=True),
        "weight_decay": 10.0 ** trial.suggest_int("weight_decay", -6, -2),
        "momentum": trial.suggest_float("momentum", 0.0, 0.99),
    }
