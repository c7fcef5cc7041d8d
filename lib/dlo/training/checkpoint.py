"""Atomic checkpoints with every random state, exact resume, and a clean stop on SIGTERM / SIGUSR1.
"""
from __future__ import annotations

import os
import random
import signal
from pathlib import Path
from typing import Any

import torch
from torch import nn


# --------------------------------------------------------------------------------------------------
# Checkpoints
# --------------------------------------------------------------------------------------------------

def rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    try:
        import numpy as np

        state["numpy"] = np.random.get_state()
    except ImportError:  # pragma: no cover
        pass
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "numpy" in state:
        import numpy as np

        np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def unwrap_model(model: nn.Module) -> nn.Module:
    """The module whose state_dict we save: without torch.compile's or DDP's wrapper prefixes."""
    model = getattr(model, "_orig_mod", model)
    return getattr(model, "module", model)


def save_checkpoint(path: str | os.PathLike, *, model: nn.Module, optimizer=None, scheduler=None, scaler=None,
                    step: int = 0, epoch: int = 0, batch_in_epoch: int = 0, **extra: Any) -> Path:
    """Atomic checkpoint: written to a temporary file then renamed, so a job killed mid-write never
    leaves a truncated checkpoint behind (rename is atomic on POSIX file systems)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {
        "model": unwrap_model(model).state_dict(),
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "scaler": scaler.state_dict() if scaler is not None else None,
        "rng": rng_state(),
        "step": step, "epoch": epoch, "batch_in_epoch": batch_in_epoch,
        "extra": extra,
    }
    tmp = path.with_name(path.name + ".tmp")
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def load_checkpoint(path: str | os.PathLike, *, model: nn.Module, optimizer=None, scheduler=None, scaler=None,
                    map_location: str | torch.device = "cpu", restore_rng: bool = True) -> dict[str, Any]:
    """Restore what :func:`save_checkpoint` wrote; returns the checkpoint dict (step, epoch, ...)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}: train without resume first, or give the right --ckpt path")
    state = torch.load(path, map_location=map_location, weights_only=False)
    unwrap_model(model).load_state_dict(state["model"])
    if optimizer is not None and state.get("optimizer") is not None:
        optimizer.load_state_dict(state["optimizer"])
    if scheduler is not None and state.get("scheduler") is not None:
        scheduler.load_state_dict(state["scheduler"])
    if scaler is not None and state.get("scaler") is not None:
        scaler.load_state_dict(state["scaler"])
    if restore_rng:
        set_rng_state(state["rng"])
    return state


class StopSignal:
    """Turns SIGTERM / SIGUSR1 into a flag checked between steps.

    Slurm sends SIGTERM at cancellation or preemption, and (with ``#SBATCH --signal=USR1@120``) SIGUSR1
    some time before the time limit. Dying inside ``optimizer.step()`` would lose everything since the
    last checkpoint; instead we note the signal, finish the current step, save, and exit cleanly.
    """

    SIGNALS = ("SIGTERM", "SIGUSR1")

    def __init__(self) -> None:
        self.received: str | None = None
        self._old: dict[int, Any] = {}

    def _handler(self, signum, frame) -> None:  # noqa: ARG002
        self.received = signal.Signals(signum).name

    def __enter__(self) -> "StopSignal":
        import threading

        if threading.current_thread() is threading.main_thread():  # handlers can only be set there
            for name in self.SIGNALS:
                if hasattr(signal, name):
                    sig = getattr(signal, name)
                    self._old[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)

    def __bool__(self) -> bool:
        return self.received is not None
