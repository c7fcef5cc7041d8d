"""Counts with torch.bincount without minlength: when the last expert receives no decision the counts are one
short and f · P no longer lines up (a shape error)."""
import torch

EXPECT = ["minlength"]


def load_balancing_loss(router_probs, expert_index, num_experts):
    f = torch.bincount(expert_index.reshape(-1)).to(router_probs.dtype) / expert_index.numel()
    return num_experts * (f * router_probs.mean(0)).sum()
