"""Family: part of the result right. Puts momentum on a log scale too (from 1e-3): it does not span decades, and
the sampler then spends most trials on momenta near 0."""
EXPECT = "linear scale"


def search_space(trial):
    return {
        "lr": trial.suggest_float("lr", 1e-4, 1.0, log=True),
        "weight_decay": trial.suggest_float("weight_decay", 1e-6, 1e-2, log=True),
        "momentum": trial.suggest_float("momentum", 1e-3, 0.99, log=True),
    }
