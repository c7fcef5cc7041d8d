"""Sharded checkpoints (``torch.distributed.checkpoint``): each rank writes its own shards, and a folder is loaded
without running anything from it (its ``.metadata`` is read by an unpickler that allows only what the course
wrote, checked before any collective)."""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn

import dlo.parallel.fsdp.sharded_folders as folders


def save_sharded(path: str | os.PathLike, model: nn.Module, optimizer, step: int, *, keep: int = 1) -> Path:
    """Each rank writes its own shards (``torch.distributed.checkpoint``): no rank ever holds the full model.

    The save is whole or absent (:mod:`dlo.parallel.fsdp.sharded_folders`): the shards go to a new folder
    ``<path>/.partial-step-<N>``, which becomes the checkpoint ``<path>/step-<N>`` only once every rank has
    finished (a barrier, then rank 0's commit marker and one rename); the ``keep`` newest complete checkpoints are
    kept, older ones removed after the commit. Every rank returns the committed folder, or raises the same one-line
    error when the commit failed."""
    import torch.distributed as dist

    root = Path(path)
    distributed = dist.is_available() and dist.is_initialized()
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    partial, target = folders.partial_folder(root, step), folders.step_folder(root, step)
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(partial, ignore_errors=True)  # a save of this step that was killed before
    _barrier(distributed)
    _write_shards(partial, model, optimizer, step)
    _barrier(distributed)  # every rank's shards are written (and fsynced) before anything is committed
    error = None
    if rank == 0:
        try:
            _commit(partial, target, step, world)
            folders.prune(root, keep)
        except Exception as exc:  # noqa: BLE001 - told to every rank below, in one line
            error = f"sharded checkpoint {target} not committed: {' '.join(str(exc).split()) or type(exc).__name__}"
    if distributed:
        box = [error]
        dist.broadcast_object_list(box, src=0)
        error = box[0]
    if error:
        raise RuntimeError(error)
    return target


def _barrier(distributed: bool) -> None:
    if distributed:
        import torch.distributed as dist

        dist.barrier()


def _write_shards(folder: Path, model: nn.Module, optimizer, step: int) -> None:
    """Every rank: its shards (and rank 0 the ``.metadata``) into ``folder``, each file fsynced."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd, "step": torch.tensor(step)},
             storage_writer=FileSystemWriter(str(folder), sync_files=True))


def _commit(partial: Path, target: Path, step: int, world: int) -> None:
    """Rank 0, once every rank has written: the marker, then the rename (:func:`sharded_folders.commit`)."""
    folders.commit(partial, target, step, world)


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
    if file.is_file() and not file.resolve().is_relative_to(Path(path).resolve()):
        raise UnsafeCheckpoint(f"{file} is a link to a file outside the checkpoint folder: refused")
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
    inside = Path(path).resolve()
    for info in (metadata.storage_data or {}).values():
        name = getattr(info, "relative_path", None)
        if not isinstance(name, str) or not name or name != Path(name).name or name in (".", ".."):
            raise UnsafeCheckpoint(f"{file} points outside its folder ({name!r}): refused")
        if not (Path(path) / name).resolve().is_relative_to(inside):
            raise UnsafeCheckpoint(f"{Path(path) / name} is a link to a file outside the checkpoint folder: refused")
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


def load_sharded(path: str | os.PathLike, model: nn.Module, optimizer, *, quiet: bool = False) -> int:
    """Load the newest complete :func:`save_sharded` checkpoint of ``path`` into an identically sharded model and
    optimizer; returns its step. Rank 0 says which folder it loads and which newer ones it left out (a save that
    did not finish is never loaded); ``path`` may also be a folder ``dcp.save`` wrote directly.

    Nothing in the folder is run: its ``.metadata`` is checked first (:func:`read_sharded_metadata`, a one-line
    :class:`UnsafeCheckpoint` if it names anything but checkpoint metadata or a file outside the folder, links
    included), then read again by the same safe reader inside ``dcp.load``, and the non-tensor values are loaded
    with ``weights_only=True``. A model of another shape is one line naming the first tensor that differs."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    choice = folders.newest_complete(path)
    folder = choice.folder
    metadata = read_sharded_metadata(folder)  # every rank, before any collective: a refusal is one line on each
    rank0 = not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0
    if rank0 and not quiet and folder != Path(path):
        print(choice.describe(), flush=True)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    _check_shapes(metadata, model_sd, folder)
    state = {"model": model_sd, "optim": optim_sd, "step": torch.tensor(0)}
    try:
        dcp.load(state, storage_reader=_safe_dcp_reader(folder), planner=_safe_load_planner())
    except CheckpointException as exc:  # a BaseException: the ranks' tracebacks, many lines
        refused = [f[0] for f in exc.failures.values() if isinstance(f, tuple) and isinstance(f[0], UnsafeCheckpoint)]
        if refused:
            raise UnsafeCheckpoint(f"sharded checkpoint {folder}: {refused[0]}") from None
        raise
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return int(state["step"])


def _check_shapes(metadata, model_sd: dict[str, Any], folder: Path) -> None:
    """ValueError in one line for the first model tensor missing from the checkpoint or of another shape."""
    saved = metadata.state_dict_metadata
    for name, value in model_sd.items():
        key = f"model.{name}"
        if not isinstance(value, torch.Tensor):
            continue
        if key not in saved:
            raise ValueError(f"sharded checkpoint {folder} has no {key}: load it into the model it was saved from")
        size = getattr(saved[key], "size", None)
        if size is not None and tuple(size) != tuple(value.shape):
            raise ValueError(f"sharded checkpoint {folder}: {key} is {tuple(size)} there and {tuple(value.shape)} in "
                             f"this model: load it into the model it was saved from")
