"""Family: a flag set but the behaviour wrong. Samples the three hyper-parameters, then returns fixed values: the
trial records one configuration and trains another."""
EXPECT = "value sampled"


def search_space(trial):
    trial.suggest_float("lr", 1e-4, 1.0, log=True)
    trial.suggest_float("weight_decay", 1e-6, 1e-2, log=True)
    trial.suggest_float("momentum", 0.0, 0.99)
    return {"lr": 0.1, "weight_decay": 5e-4, "momentum": 0.9}
