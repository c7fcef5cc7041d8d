"""Layer 2, data: CIFAR-10 (the real files, or generated ones in the same format, always saying which), a
validation set held out of the training split (``splits``: every choice is scored there, never on the test split),
transforms and DataLoaders with every knob, token streams for the LLM workshops, MixUp/CutMix kernels.
"""
from __future__ import annotations

from .format import (
    CLASSES, CIFAR10_MEAN, CIFAR10_STD, BASE_FOLDER, MARKER_NAME, UnsafePickleError, load_batch, CIFAR10Files,
)
from .cifar import SEARCH_LAYOUTS, find_cifar10, cifar10
from .generated import read_generated_marker, make_generated_cifar10, generated_cache_root, GeneratedCIFAR10
from .splits import DEFAULT_VAL_FRACTION, SPLIT_SEED, split_indices, HeldOut, holdout, cifar10_train_val
from .loaders import (
    train_transform, test_transform, available_cores, make_loader, preload_batches, synthetic_batch, Batches,
)

__all__ = [
    "CLASSES",
    "CIFAR10_MEAN",
    "CIFAR10_STD",
    "BASE_FOLDER",
    "MARKER_NAME",
    "UnsafePickleError",
    "load_batch",
    "CIFAR10Files",
    "SEARCH_LAYOUTS",
    "find_cifar10",
    "cifar10",
    "read_generated_marker",
    "make_generated_cifar10",
    "generated_cache_root",
    "GeneratedCIFAR10",
    "DEFAULT_VAL_FRACTION",
    "SPLIT_SEED",
    "split_indices",
    "HeldOut",
    "holdout",
    "cifar10_train_val",
    "train_transform",
    "test_transform",
    "available_cores",
    "make_loader",
    "preload_batches",
    "synthetic_batch",
    "Batches",
]
