"""The answer's shape: every reason says 'not supported', never which condition fails."""
import torch
from torch.nn.attention import SDPBackend

EXPECT = "does not name what rules it out"


def choose_sdpa_backends(case):
    half = case.dtype in (torch.float16, torch.bfloat16)
    reasons = {}
    if case.device == "cpu":
        reasons[SDPBackend.EFFICIENT_ATTENTION] = "no CPU kernel: the memory-efficient kernel is CUDA only"
        if case.dropout_p > 0:
            reasons[SDPBackend.FLASH_ATTENTION] = "the CPU flash kernel does not apply dropout"
    else:
        flash = []
        if case.capability < (8, 0):
            flash.append(f"compute capability {case.capability} is below (8, 0)")
        if not half:
            flash.append(f"dtype {case.dtype} is not fp16 or bf16")
        if case.head_dim % 8 or case.head_dim > 256:
            flash.append(f"head_dim {case.head_dim} is not a multiple of 8 up to 256")
        if case.has_mask:
            flash.append("an explicit attn_mask (flash takes is_causal only)")
        efficient = []
        if case.capability < (5, 0):
            efficient.append(f"compute capability {case.capability} is below (5, 0)")
        if not (half or case.dtype == torch.float32):
            efficient.append(f"dtype {case.dtype} is not fp16, bf16 or fp32")
        if case.head_dim % (8 if half else 4):
            efficient.append(f"head_dim {case.head_dim} is not a multiple of {8 if half else 4}")
        if flash:
            reasons[SDPBackend.FLASH_ATTENTION] = "; ".join(flash)
        if efficient:
            reasons[SDPBackend.EFFICIENT_ATTENTION] = "; ".join(efficient)
    reasons = {b: "not supported here" for b in reasons}
    backends = [b for b in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION) if b not in reasons]
    return backends + [SDPBackend.MATH], reasons
