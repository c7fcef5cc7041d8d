"""Family: inputs that never reach the mistake (one precision only). Counts the gradients at 4 bytes (float32, a
numel() * 4 habit): with bf16 mixed precision they are bf16, 2 bytes each."""
EXPECT = "gradients at 4 bytes"


def model_state_bytes(n_params, n_gpus, strategy):
    weights, grads, optim = 2 * n_params, 4 * n_params, 12 * n_params
    if strategy == "ddp":
        return weights + grads + optim
    if strategy == "zero1":
        return weights + grads + optim / n_gpus
    if strategy == "zero2":
        return weights + (grads + optim) / n_gpus
    return (weights + grads + optim) / n_gpus
