"""The CIFAR-10 python format (``cifar-10-batches-py``): class names, statistics, file names and checksums.
"""
from __future__ import annotations

import hashlib
from pathlib import Path




CLASSES: tuple[str, ...] = (
    "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck",
)
# Per-channel mean and standard deviation of the 50 000 real CIFAR-10 training images (pixels in [0, 1]).
# Generated data is normalised with the same constants, so a model and its pipeline never change.
CIFAR10_MEAN: tuple[float, float, float] = (0.4914, 0.4822, 0.4465)
CIFAR10_STD: tuple[float, float, float] = (0.2470, 0.2435, 0.2616)

BASE_FOLDER = "cifar-10-batches-py"  # the folder name torchvision expects under its `root`
MARKER_NAME = "GENERATED.json"  # written inside a generated cifar-10-batches-py folder, never in a real one

_TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
_TEST_FILE = "test_batch"
_META_FILE = "batches.meta"
_ALL_FILES = (*_TRAIN_FILES, _TEST_FILE, _META_FILE)


def _md5(path: Path) -> str:
    h = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
