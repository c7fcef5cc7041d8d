"""Transforms and DataLoaders with every knob exposed, preloaded device batches and synthetic batches.
"""
from __future__ import annotations

import os
import warnings
from typing import Callable, Iterable, Iterator

import torch
from torch.utils.data import DataLoader, Dataset, default_collate


from torchvision.transforms import v2  # noqa: E402
from dlo.runtime.validate import is_int
from dlo.data.format import CIFAR10_MEAN, CIFAR10_STD, CLASSES
from dlo.data.generated import _SIZE


# --------------------------------------------------------------------------------------------------------
# Transforms
# --------------------------------------------------------------------------------------------------------

def train_transform(augment: bool = True) -> v2.Compose:
    """PIL image -> normalised float32 tensor ``[3, 32, 32]``, with the classic CIFAR augmentation.

    ``RandomCrop(32, padding=4)`` (shift by up to 4 pixels, zero border) and ``RandomHorizontalFlip`` give the
    model new views of each image every epoch. They run on the uint8 image, before the conversion to float,
    because that is the cheapest place: one byte per value instead of four. ``augment=False`` is
    :func:`test_transform`: useful to time the loader without augmentation.
    """
    steps: list = [v2.ToImage()]
    if augment:
        steps += [v2.RandomCrop(32, padding=4), v2.RandomHorizontalFlip()]
    steps += [v2.ToDtype(torch.float32, scale=True), v2.Normalize(CIFAR10_MEAN, CIFAR10_STD)]
    return v2.Compose(steps)


def test_transform() -> v2.Compose:
    """PIL image -> normalised float32 tensor ``[3, 32, 32]``; no randomness, so evaluation is repeatable."""
    return train_transform(augment=False)


test_transform.__test__ = False  # type: ignore[attr-defined]  # not a pytest test when imported into a test module


# --------------------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------------------

def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask, which Slurm sets), not the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS / Windows have no sched_getaffinity
        return os.cpu_count() or 1




def make_loader(dataset: Dataset, batch_size: int, *, shuffle: bool | None = None, num_workers: int = 0,
                pin_memory: bool = False, prefetch_factor: int | None = None, persistent_workers: bool = False,
                drop_last: bool = False, seed: int | None = None, sampler=None,
                generator: torch.Generator | None = None) -> DataLoader:
    """A ``torch.utils.data.DataLoader`` with every knob the lessons tune, checked first.

    * ``num_workers``: processes that load and transform batches while the model computes. 0 loads in the
      training process itself. More workers than CPU cores only makes them fight for the cores (a warning
      says so; under Slurm the cores you get are those of ``--cpus-per-task``).
    * ``pin_memory``: page-locked host buffers, so the copy to the GPU can be asynchronous
      (``.to("cuda", non_blocking=True)``). Useless without a GPU.
    * ``prefetch_factor`` (batches each worker prepares ahead) and ``persistent_workers`` (keep workers
      alive between epochs, instead of restarting them) only exist with workers.
    * ``shuffle``: None means "shuffle unless a ``sampler`` decides the order" (e.g. a DistributedSampler).
    * ``seed``: a seeded ``torch.Generator``, so the shuffling order (and the workers' random augmentations,
      for a fixed ``num_workers``) are the same from run to run. Or pass your own ``generator``.
    """
    if not is_int(batch_size) or batch_size <= 0:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if not is_int(num_workers) or num_workers < 0:
        raise ValueError(f"num_workers must be an integer >= 0 (0 = load in the main process), got {num_workers!r}")
    if num_workers == 0 and prefetch_factor is not None:
        raise ValueError(f"prefetch_factor={prefetch_factor} needs worker processes: set num_workers > 0, "
                         f"or leave prefetch_factor=None")
    if num_workers == 0 and persistent_workers:
        raise ValueError("persistent_workers=True needs worker processes: set num_workers > 0, "
                         "or leave persistent_workers=False")
    if prefetch_factor is not None and (not is_int(prefetch_factor) or prefetch_factor <= 0):
        raise ValueError(f"prefetch_factor must be a positive integer (batches per worker), got {prefetch_factor!r}")
    if seed is not None and generator is not None:
        raise ValueError("give seed or generator, not both (seed just builds a seeded generator)")
    if seed is not None and not is_int(seed):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    if sampler is not None and shuffle:
        raise ValueError("a sampler decides the order itself: leave shuffle unset (or False) when you pass sampler=")
    cores = available_cores()
    if num_workers > cores:
        warnings.warn(f"num_workers={num_workers} is more than the {cores} CPU cores available to this process: "
                      f"workers will compete for cores; use at most {cores} workers, or ask for more cores "
                      f"(under Slurm: --cpus-per-task)", UserWarning, stacklevel=2)
    if seed is not None:
        generator = torch.Generator().manual_seed(int(seed))
    if shuffle is None:
        shuffle = sampler is None
    return DataLoader(
        dataset, batch_size=int(batch_size), shuffle=bool(shuffle), sampler=sampler, num_workers=int(num_workers),
        pin_memory=pin_memory, drop_last=drop_last, generator=generator,
        prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
    )


def _to_device(batch, device: torch.device, channels_last: bool) -> tuple[torch.Tensor, torch.Tensor]:
    if not (isinstance(batch, (tuple, list)) and len(batch) == 2 and all(isinstance(t, torch.Tensor) for t in batch)):
        raise TypeError("batches must be (images, labels) tensors: give the dataset a transform that makes "
                        "tensors, e.g. transform=test_transform()")
    images, labels = batch
    images = images.to(device)
    if channels_last:
        if images.dim() != 4:
            raise ValueError(f"channels_last needs images of shape [B, C, H, W], got {tuple(images.shape)}")
        images = images.contiguous(memory_format=torch.channels_last)
    return images, labels.to(device)


def preload_batches(loader_or_dataset: DataLoader | Dataset, n_batches: int, batch_size: int | None = None,
                    device: str | torch.device = "cpu", channels_last: bool = False) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``n_batches`` batches ``(images, labels)`` materialised on ``device``, ready to be reused.

    Timing a training step on these measures the compute alone: no loading, decoding, augmenting or
    copying to the GPU. Compare with the time per step through the loader to see what the input pipeline
    costs. From a DataLoader: its first ``n_batches`` batches (its own batch size). From a Dataset:
    consecutive items ``0, 1, 2, ...`` grouped by ``batch_size`` (required then). ``channels_last`` stores
    the images NHWC in memory, the layout tensor cores prefer (the shape stays ``[B, C, H, W]``).
    """
    if not is_int(n_batches) or n_batches <= 0:
        raise ValueError(f"n_batches must be a positive integer, got {n_batches!r}")
    device = torch.device(device)
    out: list[tuple[torch.Tensor, torch.Tensor]] = []
    if isinstance(loader_or_dataset, DataLoader):
        loader = loader_or_dataset
        if batch_size is not None and batch_size != loader.batch_size:
            raise ValueError(f"batch_size={batch_size} differs from the loader's batch_size={loader.batch_size}: "
                             f"leave batch_size=None with a DataLoader (or make a new loader)")
        try:
            for batch in loader:
                out.append(_to_device(batch, device, channels_last))
                if len(out) == n_batches:
                    break
        except TypeError as exc:
            if "collate" not in str(exc):
                raise
            raise TypeError("batches must be (images, labels) tensors: give the dataset a transform that makes "
                            "tensors, e.g. transform=test_transform()") from None
        if len(out) < n_batches:
            raise ValueError(f"the loader gave only {len(out)} batches, {n_batches} were asked: ask for fewer")
        return out
    if batch_size is None:
        raise ValueError("batch_size is required when preloading from a Dataset (a DataLoader brings its own)")
    if not is_int(batch_size) or batch_size <= 0:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    need = n_batches * batch_size
    if need > len(loader_or_dataset):
        raise ValueError(f"{n_batches} batches of {batch_size} need {need} items, the dataset has "
                         f"{len(loader_or_dataset)}: ask for fewer or smaller batches")
    for b in range(n_batches):
        items = [loader_or_dataset[i] for i in range(b * batch_size, (b + 1) * batch_size)]
        try:
            batch = default_collate(items)
        except TypeError:
            batch = None  # PIL images cannot be stacked: _to_device explains
        out.append(_to_device(batch, device, channels_last))
    return out


def synthetic_batch(batch_size: int, device: str | torch.device = "cpu", seed: int = 0, *,
                    channels_last: bool = False, size: int = _SIZE,
                    num_classes: int = len(CLASSES)) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ``(images [B, 3, size, size] float32 ~ N(0, 1), labels [B] int64 in 0..num_classes-1)`` for pure
    compute timing: CIFAR's 32x32 and 10 classes by default, ImageNet's shape with ``size=224, num_classes=1000``.

    Already "normalised", with no data behind it: the step time measured on it is what the model costs,
    whatever the disk, the loader or the dataset. Drawn on the CPU from ``seed``, then moved, so the values
    are the same on every device.
    """
    if not is_int(batch_size) or batch_size <= 0:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    gen = torch.Generator().manual_seed(int(seed))
    for name, value in (("size", size), ("num_classes", num_classes)):
        if not is_int(value) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    images = torch.randn(batch_size, 3, size, size, generator=gen)
    labels = torch.randint(0, num_classes, (batch_size,), generator=gen)
    return _to_device((images, labels), torch.device(device), channels_last)


class Batches:
    """A re-iterable source of batches with a length: what :func:`dlo.training.loop.train` asks of a loader,
    for data that lives in tensors already (a lesson's small dataset preloaded on the device). ``make()``
    returns a fresh iterator of ``(inputs, targets)`` each time it is called."""

    def __init__(self, make: Callable[[], Iterable], length: int) -> None:
        self.make, self.length = make, length

    def __iter__(self) -> Iterator:
        return iter(self.make())

    def __len__(self) -> int:
        return self.length
