"""Which device a run uses (``$DLO_DEVICE``, else CUDA when visible, else CPU), and waiting for it.
"""
from __future__ import annotations

import os
import re

import torch
DEVICE_ENV = "DLO_DEVICE"


# ----------------------------------------------------------------------------------------------------
# Devices
# ----------------------------------------------------------------------------------------------------
def pick_device(prefer: str | torch.device | None = None) -> torch.device:
    """The device to compute on: ``"auto"`` (GPU if one is visible, else CPU), ``"cpu"``, ``"cuda"``, ``"cuda:N"``.

    With ``prefer=None`` the environment variable ``DLO_DEVICE`` decides (so a whole notebook can be
    forced onto the CPU from outside), and ``"auto"`` when it is unset. Asking for a GPU that is not
    there raises instead of quietly falling back to the CPU: a benchmark that silently ran on the CPU
    would teach the wrong lesson.
    """
    from_env = False
    if prefer is None:
        env = os.environ.get(DEVICE_ENV, "").strip()
        from_env = bool(env)
        prefer = env or "auto"
    if isinstance(prefer, torch.device):
        prefer = str(prefer)
    if not isinstance(prefer, str):
        raise ValueError(f"device must be a string like 'auto', 'cpu', 'cuda' or 'cuda:0', not {type(prefer).__name__}")
    where = f" (from ${DEVICE_ENV})" if from_env else ""
    name = prefer.strip().lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    match = re.fullmatch(r"cuda(?::(\d+))?", name)
    if match is None:
        raise ValueError(f"unknown device {prefer!r}{where}: use 'auto', 'cpu', 'cuda' or 'cuda:N'")
    if not torch.cuda.is_available():
        raise ValueError(
            f"device {prefer!r}{where} was requested but no GPU is visible (torch.cuda.is_available() is False): "
            "use device='auto' or 'cpu'"
        )
    if match.group(1) is None:
        return torch.device("cuda")
    index, count = int(match.group(1)), torch.cuda.device_count()
    if index >= count:
        raise ValueError(
            f"device {prefer!r}{where} does not exist: only {count} GPU(s) are visible, use cuda:0..cuda:{count - 1}"
        )
    return torch.device("cuda", index)


def synchronize(device: torch.device | str | None = None) -> None:
    """Wait for all queued GPU work (no-op on CPU)."""
    device = torch.device(device) if device is not None else None
    if (device is None or device.type == "cuda") and torch.cuda.is_available():
        torch.cuda.synchronize(device)
