"""Family: a flag set but the behaviour wrong. "Samples" momentum from a categorical with one choice: the trial
records a hyper-parameter, but every trial gets 0.9 and the range is never explored."""
EXPECT = "momentum: expected a float in [0.0, 0.99]"


def search_space(trial):
    return {
        "lr": trial.suggest_float("lr", 1e-4, 1.0, log=True),
        "weight_decay": trial.suggest_float("weight_decay", 1e-6, 1e-2, log=True),
        "momentum": trial.suggest_categorical("momentum", [0.9]),
    }
