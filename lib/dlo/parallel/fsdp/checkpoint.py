"""Sharded checkpoints (``torch.distributed.checkpoint``): each rank writes its own shards, and a folder is loaded
without running anything from it (its ``.metadata`` is read by an unpickler that allows only what the course
wrote, checked before any collective)."""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import torch
from torch import nn


def save_sharded(path: str | os.PathLike, model: nn.Module, optimizer, step: int) -> Path:
    """Each rank writes its own shards (``torch.distributed.checkpoint``): no rank ever holds the full model."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd, "step": torch.tensor(step)}, checkpoint_id=str(path))
    return Path(path)


# What the ``.metadata`` pickle of a torch.distributed.checkpoint save may name (found in real saves of torch 2.11 and
# 2.13): the metadata dataclasses, torch sizes, dtypes and layouts, the folder's path. Anything else (os.system,
# builtins.eval, ...) is refused before it is called: torch's own reader unpickles the file with pickle.load.
_DCP_METADATA_GLOBALS = frozenset({
    *(("torch.distributed.checkpoint.metadata", name) for name in (
        "Metadata", "MetadataIndex", "StorageMeta", "TensorStorageMetadata", "BytesStorageMetadata",
        "ChunkStorageMetadata", "TensorProperties", "_MEM_FORMAT_ENCODING")),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.serialization", "_get_layout"),
    ("torch", "Size"),
    *(("pathlib", name) for name in ("PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath")),
})


class UnsafeCheckpoint(ValueError):
    """A sharded checkpoint folder whose files are not what :func:`save_sharded` writes (nothing of it was run)."""


def _metadata_unpickler(file):
    import pickle

    class MetadataUnpickler(pickle.Unpickler):
        def find_class(self, module: str, name: str):
            if (module, name) in _DCP_METADATA_GLOBALS or (
                    module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
                return super().find_class(module, name)
            raise pickle.UnpicklingError(f"it names {module}.{name}, which no checkpoint metadata contains")

    return MetadataUnpickler(file)


def read_sharded_metadata(path: str | os.PathLike, *, file_name: str = ".metadata"):
    """The ``Metadata`` of a sharded checkpoint folder, read without running anything from it.

    torch.distributed.checkpoint reads this file with ``pickle.load``: a crafted folder would run its code in
    every process that loads it. Here only the classes a checkpoint's metadata is made of can be named; the
    shards it points to must be files of the folder itself. Anything else is :class:`UnsafeCheckpoint`,
    one line naming the file."""
    from torch.distributed.checkpoint.metadata import Metadata

    file = Path(path) / file_name
    if not file.is_file():
        raise FileNotFoundError(f"no sharded checkpoint at {path}: {file} does not exist (save one with save_sharded)")
    try:
        with open(file, "rb") as f:
            metadata = _metadata_unpickler(f).load()
    except Exception as exc:  # noqa: BLE001 - any unpickling error of a crafted or damaged file
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise UnsafeCheckpoint(f"{file} is not the metadata of a sharded checkpoint, refused without running "
                               f"it: {reason}") from None
    if not isinstance(metadata, Metadata):
        raise UnsafeCheckpoint(f"{file} is not the metadata of a sharded checkpoint: it holds a "
                               f"{type(metadata).__name__}, not a Metadata")
    for info in (metadata.storage_data or {}).values():
        name = getattr(info, "relative_path", None)
        if not isinstance(name, str) or not name or name != Path(name).name or name in (".", ".."):
            raise UnsafeCheckpoint(f"{file} points outside its folder ({name!r}): refused")
    return metadata


def _safe_dcp_reader(path: str | os.PathLike):
    """A ``FileSystemReader`` that reads the ``.metadata`` with :func:`read_sharded_metadata`."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any):
            rank = kwargs.get("rank")
            name = ".metadata" if rank is None else f"__{rank}.metadata"
            metadata = read_sharded_metadata(self.path, file_name=name)
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeReader(path)


def _safe_load_planner():
    """torch's ``DefaultLoadPlanner``, except that the non-tensor values (the optimizer's ``lr``, ``betas``...)
    are read with ``torch.load(weights_only=True)``: torch's own planner reads them with ``weights_only=False``,
    so a crafted shard file would run code. What passes is plain data, handed on to torch's planner."""
    import io

    from torch.distributed.checkpoint import DefaultLoadPlanner

    class SafeLoadPlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item, value) -> None:
            try:
                obj = torch.load(value, weights_only=True)
            except Exception as exc:  # noqa: BLE001 - any refusal or damage: one line
                text = " ".join(str(exc).split())
                found = re.search(r"WeightsUnpickler error: (.*?\.)( |$)", text)
                reason = found.group(1) if found else text[:200]
                raise UnsafeCheckpoint(f"its value {read_item.dest_index.fqn} is not plain data, refused without "
                                       f"running it: {reason}") from None
            plain = io.BytesIO()
            torch.save(obj, plain)  # checked plain data, written again by us
            plain.seek(0)
            super().load_bytes(read_item, plain)

    return SafeLoadPlanner()


def load_sharded(path: str | os.PathLike, model: nn.Module, optimizer) -> int:
    """Load a :func:`save_sharded` checkpoint into an identically sharded model and optimizer; returns the step.

    Nothing in the folder is run: its ``.metadata`` is checked first (:func:`read_sharded_metadata`, a one-line
    :class:`UnsafeCheckpoint` if it names anything but checkpoint metadata), then read again by the same safe
    reader inside ``dcp.load``, and the non-tensor values are loaded with ``weights_only=True``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    if not Path(path).is_dir():
        raise FileNotFoundError(f"no sharded checkpoint at {path}: save one first (save_sharded)")
    read_sharded_metadata(path)  # every rank, before any collective: a refusal is one line, on every rank
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd, "step": torch.tensor(0)}
    try:
        dcp.load(state, storage_reader=_safe_dcp_reader(path), planner=_safe_load_planner())
    except CheckpointException as exc:  # a BaseException: the ranks' tracebacks, many lines
        refused = [f[0] for f in exc.failures.values() if isinstance(f, tuple) and isinstance(f[0], UnsafeCheckpoint)]
        if refused:
            raise UnsafeCheckpoint(f"sharded checkpoint {path}: {refused[0]}") from None
        raise
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return int(state["step"])
