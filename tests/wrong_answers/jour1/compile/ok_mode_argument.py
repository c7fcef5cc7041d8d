"""Correct: a compile mode that still compiles (no CUDA graphs)."""
import torch


def compile_model(model):
    return torch.compile(model, mode="max-autotune-no-cudagraphs", dynamic=False)
