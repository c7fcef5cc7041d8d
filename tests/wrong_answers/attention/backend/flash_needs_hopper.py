"""A threshold one step too far: flash offered from compute capability 9.0 (Hopper) only, so an A100 (8.0) or an RTX 30xx (8.6) falls back. Family: inputs that never reach the mistake (before, the only GPU on which flash could run was an H100)."""
import torch
from torch.nn.attention import SDPBackend

EXPECT = '8.0 included'


def choose_sdpa_backends(case):
    half = case.dtype in (torch.float16, torch.bfloat16)
    reasons = {}
    if case.device == "cpu":
        reasons[SDPBackend.EFFICIENT_ATTENTION] = "no CPU kernel: the memory-efficient kernel is CUDA code"
        if case.dropout_p > 0:
            reasons[SDPBackend.FLASH_ATTENTION] = f"the CPU flash kernel does not apply dropout (dropout_p={case.dropout_p})"
    else:
        flash, efficient = [], []
        if case.capability < (9, 0):
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
