"""Family: unknown inputs silently mapped. An if-chain whose last branch answers zero3 for any other name: a typo
('zero4', 'ZeRO-2') gets ZeRO-3's figure instead of an error."""

EXPECT = "unknown strategy"


def model_state_bytes(n_params, n_gpus, strategy):
    if strategy == "ddp":
        return 16 * n_params
    if strategy == "zero1":
        return 4 * n_params + 12 * n_params / n_gpus
    if strategy == "zero2":
        return 2 * n_params + 14 * n_params / n_gpus
    return 16 * n_params / n_gpus
