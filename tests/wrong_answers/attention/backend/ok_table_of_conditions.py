"""Correct, written as a table: each fused kernel's conditions as (test, reason) pairs, read in one loop."""
import torch
from torch.nn.attention import SDPBackend

HALF = (torch.float16, torch.bfloat16)


def choose_sdpa_backends(case):
    d, dt, cap = case.head_dim, case.dtype, case.capability
    if case.device == "cuda":
        table = {
            SDPBackend.FLASH_ATTENTION: [
                (cap >= (8, 0), "needs compute capability 8.0 (Ampere) or newer"),
                (dt in HALF, "takes fp16 or bf16 only"),
                (d % 8 == 0 and d <= 256, "head_dim must be a multiple of 8, at most 256"),
                (not case.has_mask, "cannot take an attn_mask tensor"),
            ],
            SDPBackend.EFFICIENT_ATTENTION: [
                (cap >= (5, 0), "compute capability below 5.0"),
                (dt in HALF + (torch.float32,), "float64 is not supported"),
                (d % (8 if dt in HALF else 4) == 0, "head_dim alignment"),
            ],
        }
    else:
        table = {
            SDPBackend.FLASH_ATTENTION: [(case.dropout_p == 0, "dropout is not applied by the CPU kernel")],
            SDPBackend.EFFICIENT_ATTENTION: [(False, "CUDA-only kernel")],
        }
    reasons = {}
    for backend, conditions in table.items():
        failed = [why for ok, why in conditions if not ok]
        if failed:
            reasons[backend] = ", ".join(failed)
    chosen = tuple(b for b in table if b not in reasons) + (SDPBackend.MATH,)
    return chosen, reasons
