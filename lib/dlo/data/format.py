"""The CIFAR-10 python format (``cifar-10-batches-py``): class names, statistics, file names and checksums,
and :class:`CIFAR10Files`, torchvision's CIFAR10 reading those files without running code from them.

The batch files are pickles. A plain ``pickle.load`` runs whatever functions a file names, so a crafted
``data_batch_1`` (in a data folder, or a generated folder whose ``GENERATED.json`` lists its own md5 sums)
would run code on the machine that opens it. :func:`load_batch` reads them with an unpickler that may build
only what the CIFAR format contains (dicts, lists, strings, numbers and numpy arrays) and refuses anything else.
"""
from __future__ import annotations

import hashlib
import io
import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torchvision.datasets.cifar as _tv_cifar
from torchvision.datasets import CIFAR10
from torchvision.datasets.vision import VisionDataset

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


# --------------------------------------------------------------------------------------------------------
# Reading the batch files without running code from them
# --------------------------------------------------------------------------------------------------------

_NP_RECONSTRUCT = np.empty(0).__reduce__()[0]
_NP_FROMBUFFER = np.empty(0).__reduce_ex__(5)[0]


def _latin1_bytes(text: str, encoding: str = "latin1") -> bytes:
    """How Python 3 writes bytes in protocol 2 pickles (``_codecs.encode(text, "latin1")``), and only that."""
    if encoding not in ("latin1", "latin-1") or not isinstance(text, str):
        raise pickle.UnpicklingError(f"_codecs.encode with {encoding!r}: only 'latin1' is expected in a CIFAR file")
    return text.encode("latin1")


# Every global a cifar-10-batches-py pickle refers to: rebuilding a numpy array. Old pickles (the real files,
# written by Python 2) name numpy.core, newer ones numpy._core; both mean the same function. A batch saved
# again by Python 3 may also use _frombuffer (protocol 5) or _codecs.encode (bytes in protocol 2), which
# only copy bytes too.
_ALLOWED_GLOBALS: dict[tuple[str, str], Any] = {
    ("_codecs", "encode"): _latin1_bytes,
    ("numpy.core.multiarray", "_reconstruct"): _NP_RECONSTRUCT,
    ("numpy._core.multiarray", "_reconstruct"): _NP_RECONSTRUCT,
    ("numpy.core.numeric", "_frombuffer"): _NP_FROMBUFFER,
    ("numpy._core.numeric", "_frombuffer"): _NP_FROMBUFFER,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
}


class UnsafePickleError(pickle.UnpicklingError, ValueError):
    """A data file asked to load something the CIFAR format never contains (it may be crafted to run code)."""


class _CifarUnpickler(pickle.Unpickler):
    def __init__(self, file, path: Path) -> None:
        super().__init__(file, encoding="latin1")  # as torchvision: Python 2 strings become str
        self._path = path

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ALLOWED_GLOBALS[(module, name)]
        except KeyError:
            raise UnsafePickleError(
                f"{self._path} tries to load {module}.{name}, which no CIFAR batch file contains: it was not written "
                f"as CIFAR data (it may be crafted to run code); delete it and download or regenerate the data"
            ) from None


def load_batch(path: str | os.PathLike) -> dict:
    """One ``cifar-10-batches-py`` pickle (a data batch or ``batches.meta``) as a dict, safely.

    Only numpy arrays, dicts, lists, strings and numbers can come out: a file naming any other Python
    object is refused with :class:`UnsafePickleError` before anything of it runs. A file that is not a pickle
    at all (truncated, random bytes) is a ValueError. Both are one line naming the file.
    """
    path = Path(path)
    # Read the whole file first: a length field in random bytes then cannot make the unpickler allocate
    # or read more than the file holds (it reports a truncated pickle instead).
    data = path.read_bytes()
    try:
        entry = _CifarUnpickler(io.BytesIO(data), path).load()
    except UnsafePickleError:
        raise
    except Exception as exc:  # noqa: BLE001 -- bytes that are not a pickle can raise almost any error
        detail = " ".join(str(exc).split())  # some unpickler messages span two lines
        raise ValueError(f"{path} is not a readable CIFAR batch file ({type(exc).__name__}: {detail}); "
                         f"download or regenerate the data") from None
    if not isinstance(entry, dict):
        raise ValueError(f"{path} holds a {type(entry).__name__}, not the dict of a CIFAR batch file; "
                         f"download or regenerate the data")
    return entry


def _batch_arrays(path: Path, entry: dict) -> tuple[np.ndarray, list[int]]:
    """The ``data`` and labels of a batch, checked: uint8 rows of 3072 pixels, one integer label each."""
    data = entry.get("data")
    labels = entry.get("labels", entry.get("fine_labels"))
    if not (isinstance(data, np.ndarray) and data.dtype == np.uint8 and data.ndim == 2 and data.shape[1] == 3072):
        raise ValueError(f"{path} has no uint8 'data' array of 3072-pixel rows; download or regenerate the data")
    if not (isinstance(labels, list) and len(labels) == len(data) and all(isinstance(c, int) for c in labels)):
        raise ValueError(f"{path} has no list of {len(data)} integer 'labels'; download or regenerate the data")
    return data, labels


class CIFAR10Files(CIFAR10):
    """torchvision's ``CIFAR10`` (same attributes, md5 checks and download) that reads the batch files with
    :func:`load_batch` instead of ``pickle.load``: no code from a data file ever runs."""

    def __init__(self, root: str | os.PathLike, train: bool = True, transform=None, target_transform=None,
                 download: bool = False) -> None:
        # Same steps as CIFAR10.__init__, whose pickle.load would run code from the files.
        VisionDataset.__init__(self, root, transform=transform, target_transform=target_transform)
        self.train = train
        if download:
            self.download()
        if not self._check_integrity():
            raise RuntimeError("Dataset not found or corrupted. You can use download=True to download it")
        data: list[np.ndarray] = []
        self.targets: list[int] = []
        for file_name, _ in (self.train_list if train else self.test_list):
            path = Path(self.root) / self.base_folder / file_name
            rows, labels = _batch_arrays(path, load_batch(path))
            data.append(rows)
            self.targets.extend(labels)
        self.data: Any = np.vstack(data).reshape(-1, 3, 32, 32).transpose((0, 2, 3, 1))  # HWC, as torchvision
        self._load_meta()

    def _load_meta(self) -> None:
        path = Path(self.root) / self.base_folder / self.meta["filename"]
        if not _tv_cifar.check_integrity(str(path), self.meta["md5"]):  # the very check CIFAR10 makes
            raise RuntimeError("Dataset metadata file not found or corrupted. You can use download=True to download it")
        classes = load_batch(path).get(self.meta["key"])
        if not (isinstance(classes, list) and all(isinstance(c, str) for c in classes)):
            raise ValueError(f"{path} has no list of class names {self.meta['key']!r}; download or regenerate the data")
        self.classes = classes
        self.class_to_idx = {c: i for i, c in enumerate(classes)}
