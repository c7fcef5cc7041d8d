"""Correct, written with one helper per fused kernel that returns the first condition it fails (or None), and the
thresholds as named constants; reasons name one condition each."""
import torch
from torch.nn.attention import SDPBackend

AMPERE, MAXWELL, FLASH_MAX_HEAD_DIM = (8, 0), (5, 0), 256
SIXTEEN_BIT = {torch.float16, torch.bfloat16}


def _flash_refusal(case):
    if case.device == "cpu":
        return "dropout is not applied by the CPU flash kernel" if case.dropout_p else None
    if case.capability < AMPERE:
        return f"compute capability {case.capability[0]}.{case.capability[1]} is before Ampere"
    if case.dtype not in SIXTEEN_BIT:
        return "needs a 16-bit dtype (fp16 or bf16)"
    if case.head_dim > FLASH_MAX_HEAD_DIM or case.head_dim % 8 != 0:
        return f"head_dim {case.head_dim} must be a multiple of 8 and <= {FLASH_MAX_HEAD_DIM}"
    if case.has_mask:
        return "an attn_mask tensor is not accepted by the CUDA flash kernel"
    return None


def _efficient_refusal(case):
    if case.device != "cuda":
        return "the memory-efficient kernel exists on CUDA only"
    if case.capability < MAXWELL:
        return "compute capability older than 5.0"
    if case.dtype not in SIXTEEN_BIT | {torch.float32}:
        return f"dtype {case.dtype} is not supported"
    step = 8 if case.dtype in SIXTEEN_BIT else 4
    if case.head_dim % step:
        return f"head_dim is not a multiple of {step}"
    return None


def choose_sdpa_backends(case):
    reasons = {}
    for backend, refusal in ((SDPBackend.FLASH_ATTENTION, _flash_refusal), (SDPBackend.EFFICIENT_ATTENTION,
                                                                               _efficient_refusal)):
        why = refusal(case)
        if why is not None:
            reasons[backend] = why
    return [b for b in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION) if b not in reasons] + [
        SDPBackend.MATH], reasons
