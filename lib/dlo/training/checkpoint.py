"""Atomic checkpoints with every random state, exact resume, and a clean stop on SIGTERM / SIGUSR1.

Checkpoints hold only tensors and plain values (numbers, strings, lists, dicts), so they are loaded with
``torch.load`` in its ``weights_only`` mode: a file that names any other Python object (one crafted to run code
when loaded, or a pickle from another program) is refused before anything of it runs.
"""
from __future__ import annotations

import os
import pickle
import random
import re
import signal
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from dlo.runtime.atomic import atomic_write


# --------------------------------------------------------------------------------------------------
# Random states as tensors and plain values (what torch.load's weights_only mode loads)
# --------------------------------------------------------------------------------------------------

def _python_state_out(state: tuple) -> dict[str, Any]:
    version, internal, gauss_next = state
    return {"version": int(version), "internal": torch.tensor(internal, dtype=torch.int64), "gauss_next": gauss_next}


def _python_state_in(state: Any) -> tuple:
    if isinstance(state, dict):
        return (state["version"], tuple(int(x) for x in state["internal"].tolist()), state["gauss_next"])
    return state  # random.getstate()'s own tuple (a state kept in memory)


def _numpy_state_out(state: tuple) -> dict[str, Any]:
    name, keys, pos, has_gauss, cached_gaussian = state
    return {"name": str(name), "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)), "pos": int(pos),
            "has_gauss": int(has_gauss), "cached_gaussian": float(cached_gaussian)}


def _numpy_state_in(state: Any) -> tuple:
    if isinstance(state, dict):
        return (state["name"], state["keys"].numpy().astype(np.uint32), state["pos"], state["has_gauss"],
                state["cached_gaussian"])
    return state  # np.random.get_state()'s own tuple


def rng_state() -> dict[str, Any]:
    """Every global random state (torch, Python's ``random``, numpy's legacy generator, CUDA), as tensors and
    plain values, so that a checkpoint holding it loads in torch.load's ``weights_only`` mode."""
    state = {"torch": torch.get_rng_state(), "python": _python_state_out(random.getstate()),
             "numpy": _numpy_state_out(np.random.get_state())}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned: the next random numbers are those that followed it."""
    torch.set_rng_state(state["torch"])
    random.setstate(_python_state_in(state["python"]))
    if "numpy" in state:
        np.random.set_state(_numpy_state_in(state["numpy"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# --------------------------------------------------------------------------------------------------
# Checkpoints
# --------------------------------------------------------------------------------------------------

def unwrap_model(model: nn.Module) -> nn.Module:
    """The module whose state_dict we save: without torch.compile's or DDP's wrapper prefixes."""
    model = getattr(model, "_orig_mod", model)
    return getattr(model, "module", model)


def _refuse_unsafe(tmp: Path, path: Path) -> None:
    """Refuse, before it replaces a good checkpoint, a state that a ``weights_only`` load could not read back."""
    unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(tmp)
    if unsafe:
        raise ValueError(f"the checkpoint {path} would hold {', '.join(unsafe)}, which a safe load refuses: "
                         f"keep only tensors, numbers, strings, lists and dicts in state_dicts and extras")


def save_checkpoint(path: str | os.PathLike, *, model: nn.Module, optimizer=None, scheduler=None, scaler=None,
                    step: int = 0, epoch: int = 0, batch_in_epoch: int = 0, **extra: Any) -> Path:
    """Atomic checkpoint (:func:`dlo.runtime.atomic.atomic_write`: a unique temporary file, fsync, rename), so a
    job killed mid-write never leaves a truncated checkpoint behind and two writers never mix their bytes.
    ``extra`` values must be tensors or plain values (numbers, strings, lists, dicts): what a safe load accepts."""
    path = Path(path)
    state = {
        "model": unwrap_model(model).state_dict(),
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "scaler": scaler.state_dict() if scaler is not None else None,
        "rng": rng_state(),
        "step": step, "epoch": epoch, "batch_in_epoch": batch_in_epoch,
        "extra": extra,
    }

    def write(tmp: Path) -> None:
        torch.save(state, tmp)
        _refuse_unsafe(tmp, path)

    return atomic_write(path, write)


_UNSAFE_GLOBAL = re.compile(r"GLOBAL (\S+) was not an allowed global")


def read_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """The dict :func:`save_checkpoint` wrote, loaded safely (``weights_only`` mode), without applying it.

    Every failure is one line naming the file: FileNotFoundError when there is none, ValueError for a file
    that is truncated, empty, not a torch file, not a checkpoint, or that names a Python object a checkpoint
    never holds (refused before it runs: such a file may be crafted to run code).
    """
    path = Path(path)
    if path.is_dir():
        raise FileNotFoundError(f"{path} is a folder, not a checkpoint file: give the checkpoint's file path (--ckpt)")
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}: train without resume first, or give the right --ckpt path")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        found = _UNSAFE_GLOBAL.search(str(exc))
        if found:
            raise ValueError(f"{path} asks to load {found.group(1)}, which no checkpoint of dlo holds: refused "
                             f"without running it (it may be crafted to run code); use a checkpoint written by "
                             f"save_checkpoint") from None
        raise ValueError(f"{path} is not a checkpoint (not a torch file, or damaged): delete it and train again "
                         f"without resume") from None
    except Exception as exc:  # noqa: BLE001 - EOFError, RuntimeError (zip), OSError...: all mean "unreadable"
        first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), "")
        first = f": {first.split('. ')[0]}" if first else ""
        raise ValueError(f"{path} is not a readable checkpoint (truncated, empty or not a torch file; "
                         f"{type(exc).__name__}{first}): delete it and train again without resume") from None
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise ValueError(f"{path} is a torch file but not a checkpoint of save_checkpoint (no model state_dict): "
                         f"give the right --ckpt path")
    return state


def check_model_shape(path: str | os.PathLike, model: nn.Module, saved: dict[str, Any]) -> None:
    """Raise one line if the state_dict ``saved`` (from the checkpoint ``path``) does not fit ``model``:
    names or shapes differ, i.e. the checkpoint was trained with another model shape (another width...)."""
    own = unwrap_model(model).state_dict()
    differ = [k for k in own.keys() & saved.keys()
              if isinstance(saved[k], torch.Tensor) and tuple(saved[k].shape) != tuple(own[k].shape)]
    missing, unexpected = sorted(own.keys() - saved.keys()), sorted(saved.keys() - own.keys())
    if not (differ or missing or unexpected):
        return
    if differ:
        k = sorted(differ)[0]
        example = f"{k} is {tuple(saved[k].shape)} there, {tuple(own[k].shape)} here"
    else:
        example = f"missing {missing[0]}" if missing else f"unexpected {unexpected[0]}"
    raise ValueError(f"the checkpoint {path} was trained with another model shape ({len(differ)} tensors of other "
                     f"shapes, {len(missing)} missing, {len(unexpected)} unexpected; e.g. {example}): resume with "
                     f"the model options of the run that wrote it (e.g. the same --width)")


def load_checkpoint(path: str | os.PathLike, *, model: nn.Module, optimizer=None, scheduler=None, scaler=None,
                    map_location: str | torch.device = "cpu", restore_rng: bool = True) -> dict[str, Any]:
    """Restore what :func:`save_checkpoint` wrote; returns the checkpoint dict (step, epoch, ...).

    The file is read by :func:`read_checkpoint` (safely, one-line errors), and a checkpoint of another model
    shape is refused in one line (:func:`check_model_shape`) instead of torch's list of mismatched tensors.
    """
    state = read_checkpoint(path, map_location)
    check_model_shape(path, model, state["model"])
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
