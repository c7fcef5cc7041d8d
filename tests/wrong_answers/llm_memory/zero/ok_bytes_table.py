"""Correct: a table of the bytes per parameter of each kind, and which kinds each stage shards."""
BYTES = {"weights": 2, "gradients": 2, "optimizer": 12}
SHARDED = {"ddp": (), "zero1": ("optimizer",), "zero2": ("optimizer", "gradients"),
           "zero3": ("optimizer", "gradients", "weights")}


def model_state_bytes(n_params, n_gpus, strategy):
    total = 0.0
    for kind, size in BYTES.items():
        share = 1 / n_gpus if kind in SHARDED[strategy] else 1
        total += size * n_params * share
    return total
