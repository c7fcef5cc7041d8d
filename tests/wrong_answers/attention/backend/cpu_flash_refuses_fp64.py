"""The CUDA dtype rule carried to the CPU: the CPU flash kernel refused in fp64 (it takes fp16, bf16, fp32 and fp64). Family: inputs that never reach the mistake (no fp64 CPU case)."""
import torch
from torch.nn.attention import SDPBackend

EXPECT = 'fp64'


def choose_sdpa_backends(case):
    half = case.dtype in (torch.float16, torch.bfloat16)
    reasons = {}
    if case.device == "cpu":
        reasons[SDPBackend.EFFICIENT_ATTENTION] = "no CPU kernel: the memory-efficient kernel is CUDA code"
        if case.dropout_p > 0 or case.dtype == torch.float64:
            reasons[SDPBackend.FLASH_ATTENTION] = "the CPU flash kernel takes no dropout and no float64"
    else:
        flash, efficient = [], []
        if case.capability < (8, 0):
            flash.append(f"compute capability {case.capability} is older than Ampere (8, 0)")
        if not half:
            flash.append(f"dtype {case.dtype} is not fp16 or bf16")
        if case.head_dim % 8 or case.head_dim > 256:
            flash.append(f"head_dim {case.head_dim} is not a multiple of 8 up to 256")
        if case.has_mask:
            flash.append("an explicit attn_mask (the CUDA flash kernel takes is_causal only)")
        if case.capability < (5, 0):
            efficient.append(f"compute capability {case.capability} is below (5, 0)")
        if not (half or case.dtype == torch.float32):
            efficient.append(f"dtype {case.dtype} is not fp16, bf16 or fp32")
        if case.head_dim % (8 if half else 4):
            efficient.append(f"head_dim {case.head_dim} is not a multiple of {8 if half else 4}")
        for backend, failed in ((SDPBackend.FLASH_ATTENTION, flash), (SDPBackend.EFFICIENT_ATTENTION, efficient)):
            if failed:
                reasons[backend] = "; ".join(failed)
    fused = [b for b in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION) if b not in reasons]
    return fused + [SDPBackend.MATH], reasons
