"""Correct: one branch per strategy, the replicated and the sharded bytes named apart (2 bytes of bf16 weights, 2 of
gradients, 12 of fp32 master weights and Adam moments per parameter)."""


def model_state_bytes(n_params, n_gpus, strategy):
    weights, grads, optimizer = 2 * n_params, 2 * n_params, 12 * n_params
    if strategy == "ddp":
        return weights + grads + optimizer
    if strategy == "zero1":
        return weights + grads + optimizer / n_gpus
    if strategy == "zero2":
        return weights + (grads + optimizer) / n_gpus
    if strategy == "zero3":
        return (weights + grads + optimizer) / n_gpus
    raise ValueError(f"unknown strategy {strategy!r}")
