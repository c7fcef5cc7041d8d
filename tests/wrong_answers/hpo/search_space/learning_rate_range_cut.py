"""Family: inputs that never reach the mistake (a seed whose draws stay low). The learning rate's range stops at
0.1: the high rates the exercise asks to explore are never tried."""
EXPECT = "[0.0001, 1.0]"


def search_space(trial):
    return {
        "lr": trial.suggest_float("lr", 1e-4, 0.1, log=True),
        "weight_decay": trial.suggest_float("weight_decay", 1e-6, 1e-2, log=True),
        "momentum": trial.suggest_float("momentum", 0.0, 0.99),
    }
