"""CIFAR-10 for the workbook: real data when it is there, a generated stand-in when it is not.

Every lesson gets its data through :func:`cifar10`, which always states (``source``, printed once per call)
*which* dataset a run used: a timing or an accuracy means little if you do not know whether it came
from the real CIFAR-10 or from generated images.

Where real CIFAR-10 is looked for, in this order:

1. the ``data_dir`` argument;
2. the environment variable ``DLO_DATA_DIR``;
3. ``$DSDIR`` (Jean Zay keeps common datasets there, read-only): ``$DSDIR/cifar-10-batches-py``,
   ``$DSDIR/CIFAR-10/cifar-10-batches-py`` and the other layouts of :data:`SEARCH_LAYOUTS`;
4. ``<project>/data`` (where ``download=True`` puts it when no folder was given).

A folder you *name* (argument or ``DLO_DATA_DIR``) must hold the data: a wrong path is an error, never a
quiet switch to generated images. Real data is read by ``torchvision.datasets.CIFAR10`` with its md5 check.

When no real data is found (compute nodes have no internet, and CIFAR-10 cannot be downloaded there),
:func:`make_generated_cifar10` writes a *generated* dataset in the exact ``cifar-10-batches-py`` pickle
format, and the same torchvision class reads it; only the md5 list differs (it comes from the generated
folder's ``GENERATED.json`` marker instead of torchvision's table). Generated images are class-dependent
textures, learnable but not trivial, so the lessons on speed (throughput, loaders, mixed precision,
compilation, distribution) behave as on CIFAR-10; accuracies are *not* CIFAR-10 accuracies.

Import ``dlo`` (or ``dlo.data``) before ``torchvision``: the package prepares torchvision's import.
"""
from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import struct
import uuid
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, default_collate

from . import paths  # importing the package first prepares `import torchvision` (dlo._compat)

from torchvision.datasets import CIFAR10  # noqa: E402
from torchvision.datasets.utils import check_integrity  # noqa: E402
from torchvision.transforms import v2  # noqa: E402

__all__ = [
    "CLASSES",
    "CIFAR10_MEAN",
    "CIFAR10_STD",
    "BASE_FOLDER",
    "MARKER_NAME",
    "SEARCH_LAYOUTS",
    "GeneratedCIFAR10",
    "available_cores",
    "cifar10",
    "find_cifar10",
    "generated_cache_root",
    "make_generated_cifar10",
    "make_loader",
    "preload_batches",
    "read_generated_marker",
    "synthetic_batch",
    "test_transform",
    "train_transform",
]

CLASSES: tuple[str, ...] = (
    "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck",
)
# Per-channel mean and standard deviation of the 50 000 real CIFAR-10 training images (pixels in [0, 1]).
# Generated data is normalised with the same constants, so a model and its pipeline never change.
CIFAR10_MEAN: tuple[float, float, float] = (0.4914, 0.4822, 0.4465)
CIFAR10_STD: tuple[float, float, float] = (0.2470, 0.2435, 0.2616)

BASE_FOLDER = "cifar-10-batches-py"  # the folder name torchvision expects under its `root`
MARKER_NAME = "GENERATED.json"  # written inside a generated cifar-10-batches-py folder, never in a real one
# Sub-folders of a data directory (or of $DSDIR) that may hold cifar-10-batches-py.
SEARCH_LAYOUTS: tuple[str, ...] = (
    "", "CIFAR-10", "cifar-10", "CIFAR10", "cifar10", "CIFAR-10-python", "cifar-10-python",
    "torchvision", "pytorch",
)

_TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
_TEST_FILE = "test_batch"
_META_FILE = "batches.meta"
_ALL_FILES = (*_TRAIN_FILES, _TEST_FILE, _META_FILE)

_GENERATED_FORMAT = "dlo-generated-cifar10"
# Bump when the generator's output changes: caches written by an older version are then regenerated.
_GENERATED_VERSION = 1
_MIN_IMAGES = 10  # at least one image per class


# --------------------------------------------------------------------------------------------------------
# Finding real CIFAR-10
# --------------------------------------------------------------------------------------------------------

def _candidate_roots(base: Path) -> list[Path]:
    """Folders under ``base`` that could be torchvision's ``root`` (the parent of cifar-10-batches-py)."""
    roots = [base.parent] if base.name == BASE_FOLDER else []
    roots += [base / sub if sub else base for sub in SEARCH_LAYOUTS]
    return roots


def _search(base: Path) -> Path | None:
    for root in _candidate_roots(base):
        if (root / BASE_FOLDER).is_dir():
            return root
    return None


def _not_found_message(base: Path, origin: str) -> str:
    looked = ", ".join(str(r / BASE_FOLDER) for r in _candidate_roots(base)[:3])
    if (base / "data_batch_1").is_file() and base.name != BASE_FOLDER:
        return (f"{origin} {base} holds CIFAR batch files but torchvision expects them in a folder named "
                f"{BASE_FOLDER!r}: rename that folder, or give its parent")
    if not base.exists():
        what = f"{origin} {base} does not exist"
    else:
        what = f"no {BASE_FOLDER} folder under {origin} {base} (looked for {looked}, ...)"
    return (f"{what}: give the folder that contains {BASE_FOLDER} (or that folder itself), pass download=True "
            f"to fetch CIFAR-10 there, or leave it unset to use the generated dataset")


def _explicit_dir(data_dir: str | os.PathLike | None) -> tuple[Path, str] | None:
    """The data directory the user named (argument first, then DLO_DATA_DIR), with how it was named."""
    if data_dir is not None:
        return Path(data_dir).expanduser(), "data_dir"
    env = os.environ.get("DLO_DATA_DIR")
    if env:
        return Path(env).expanduser(), "DLO_DATA_DIR"
    return None


def _find(data_dir: str | os.PathLike | None, *, must_exist: bool) -> tuple[Path | None, str]:
    """``(root, how it was found)``; ``root`` is None when nothing was found.

    A directory the user named is never skipped: if it lacks the data and ``must_exist`` is true, this is
    a FileNotFoundError; otherwise (download=True) ``(None, ...)`` is returned and the caller downloads there.
    """
    explicit = _explicit_dir(data_dir)
    if explicit is not None:
        base, origin = explicit
        root = _search(base)
        if root is None and must_exist:
            raise FileNotFoundError(_not_found_message(base, origin))
        return root, origin
    dsdir = os.environ.get("DSDIR")
    if dsdir:
        root = _search(Path(dsdir))
        if root is not None:
            return root, "$DSDIR"
    project = paths.ROOT / "data"
    root = _search(project)
    if root is not None:
        return root, "the project's data/ folder"
    return None, "nowhere"


def find_cifar10(data_dir: str | os.PathLike | None = None) -> Path | None:
    """The folder holding ``cifar-10-batches-py`` (torchvision's ``root``), or None if there is none.

    Looks where :func:`cifar10` looks (``data_dir``, ``$DLO_DATA_DIR``, ``$DSDIR``, ``<project>/data``).
    A named directory without the data raises FileNotFoundError. Nothing is read or checked here.
    """
    return _find(data_dir, must_exist=True)[0]


def _download_root(data_dir: str | os.PathLike | None) -> Path:
    """Where ``download=True`` puts CIFAR-10: the named directory, else ``<project>/data``."""
    explicit = _explicit_dir(data_dir)
    if explicit is None:
        return paths.ROOT / "data"
    base = explicit[0]
    return base.parent if base.name == BASE_FOLDER else base


# --------------------------------------------------------------------------------------------------------
# Writing the cifar-10-batches-py format
# --------------------------------------------------------------------------------------------------------

_NP_RECONSTRUCT = np.empty(0).__reduce__()[0]


class _Py2Pickler(pickle._Pickler):  # type: ignore[name-defined]
    """Pickles like the Python 2 ``cPickle`` that wrote the real CIFAR-10 files (protocol 2).

    In the real files keys and strings are Python 2 byte strings. That is why the CIFAR web page shows
    ``pickle.load(f, encoding="bytes")`` giving ``b'data'`` keys, while torchvision loads with
    ``encoding="latin1"`` and gets ``'data'``. A Python 3 pickle of ``{"data": ...}`` would satisfy only
    one of the two readers, so strings and bytes are written as Python 2 strings (``BINSTRING``), and
    arrays refer to ``numpy.core.multiarray._reconstruct`` as old pickles do (numpy 1 and 2 both load it).
    """

    dispatch = pickle._Pickler.dispatch.copy()  # type: ignore[attr-defined]

    def save_py2_string(self, obj: str | bytes) -> None:
        raw = obj.encode("latin-1") if isinstance(obj, str) else bytes(obj)
        if len(raw) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(raw)]) + raw)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(raw)) + raw)
        self.memoize(obj)

    dispatch[str] = save_py2_string
    dispatch[bytes] = save_py2_string

    def save_global(self, obj: Any, name: str | None = None) -> None:
        if obj is _NP_RECONSTRUCT:
            self.write(pickle.GLOBAL + b"numpy.core.multiarray\n_reconstruct\n")
            self.memoize(obj)
            return
        super().save_global(obj, name)


def _write_pickle(path: Path, obj: dict) -> str:
    """Write ``obj`` in the CIFAR pickle format; returns the file's md5 (what torchvision checks)."""
    with open(path, "wb") as f:
        _Py2Pickler(f, protocol=2).dump(obj)
    return _md5(path)


def _md5(path: Path) -> str:
    h = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# --------------------------------------------------------------------------------------------------------
# The generator
# --------------------------------------------------------------------------------------------------------
#
# Each class is a "plaid" texture (two sine gratings crossing at +theta and -theta, a fixed spatial
# frequency) painted in a pair of colours, on a soft round "object" in front of a cluttered background.
# The class is in the texture (angle and frequency) and, partly, in the colours: the five colour pairs are
# each shared by two classes and every image gets a random tint, so colour alone gets about a third right.
# Per image, everything else is random: object position and size, texture phase (a shift), a small
# jitter of angle and frequency, texture contrast, background blobs, a distracting grating of any angle,
# horizontal flip, brightness, contrast and pixel noise. A small CNN gets well above chance within a few
# hundred steps and keeps improving for thousands, as on real data; pixels-to-logits linear models stay low.
# The class definitions are constants: the seed changes the images, never what a class looks like.

_PALETTES = np.array([  # (colour a, colour b) in RGB, pixels in [0, 1]
    [(0.80, 0.35, 0.25), (0.95, 0.80, 0.55)],  # warm
    [(0.25, 0.35, 0.70), (0.70, 0.80, 0.95)],  # blue
    [(0.25, 0.55, 0.25), (0.75, 0.85, 0.45)],  # green
    [(0.45, 0.30, 0.55), (0.90, 0.70, 0.85)],  # purple
    [(0.35, 0.35, 0.35), (0.80, 0.78, 0.72)],  # grey
], dtype=np.float32)
# Class -> (half-angle between the two gratings in degrees, cycles per 32 pixels, colour pair).
_CLASS_STYLE = (
    (15, 3.5, 0), (30, 5.5, 1), (45, 3.5, 2), (60, 5.5, 3), (75, 3.5, 4),
    (15, 5.5, 1), (30, 3.5, 2), (45, 5.5, 3), (60, 3.5, 4), (75, 5.5, 0),
)
_THETA = np.deg2rad(np.array([s[0] for s in _CLASS_STYLE], dtype=np.float32))
_FREQ = np.array([s[1] for s in _CLASS_STYLE], dtype=np.float32)
_PALETTE_OF = np.array([s[2] for s in _CLASS_STYLE])
_SIZE = 32
_CHUNK = 1000  # images generated together: bounds memory; part of the format (changing it changes images)


def _upsample_matrix(n_in: int, n_out: int = _SIZE) -> np.ndarray:
    """Bilinear interpolation as a matrix: ``U @ grid @ U.T`` turns an n_in x n_in grid into 32 x 32."""
    pos = (np.arange(n_out) + 0.5) / n_out * n_in - 0.5
    lo = np.clip(np.floor(pos).astype(int), 0, n_in - 2)
    frac = np.clip(pos - lo, 0.0, 1.0).astype(np.float32)
    u = np.zeros((n_out, n_in), dtype=np.float32)
    u[np.arange(n_out), lo] = 1.0 - frac
    u[np.arange(n_out), lo + 1] += frac
    return u


_YY, _XX = np.meshgrid(np.arange(_SIZE, dtype=np.float32), np.arange(_SIZE, dtype=np.float32), indexing="ij")
_UP4 = _upsample_matrix(4)


def _render(labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Images for ``labels`` as uint8 ``[n, 3072]`` in CIFAR's channel-major (CHW) order. Vectorised, float32."""
    n = len(labels)
    f32 = np.float32

    def per_image(a: np.ndarray) -> np.ndarray:  # [n] -> [n, 1, 1] for broadcasting over pixels
        return a.astype(f32)[:, None, None]

    # Class texture: plaid of two gratings at +/- theta, with per-image jitter of angle, frequency and phase.
    theta = _THETA[labels] + rng.normal(0.0, np.deg2rad(6.0), n)
    k = 2 * np.pi * _FREQ[labels] * np.exp(rng.normal(0.0, 0.10, n)) / _SIZE
    phase = rng.uniform(0.0, 2 * np.pi, (n, 2))
    xc = _XX * per_image(np.cos(theta) * k)
    ys = _YY * per_image(np.sin(theta) * k)
    tex = np.sin(xc + ys + per_image(phase[:, 0]))
    tex += np.sin(xc - ys + per_image(phase[:, 1]))
    tex += 2.0
    tex *= 0.25  # now in [0, 1]

    # Class colours, tinted per image, blended by the texture.
    pal = _PALETTES[_PALETTE_OF[labels]]  # [n, 2, 3]
    col_a = (pal[:, 0] + rng.normal(0.0, 0.15, (n, 3))).astype(f32)[:, :, None, None]
    col_b = (pal[:, 1] + rng.normal(0.0, 0.15, (n, 3))).astype(f32)[:, :, None, None]
    obj = (col_b - col_a) * tex[:, None]
    obj += col_a

    # Soft round object at a random place and size, with random texture contrast.
    cx = 15.5 + rng.uniform(-5.0, 5.0, n)
    cy = 15.5 + rng.uniform(-5.0, 5.0, n)
    radius = rng.uniform(7.0, 12.0, n)
    w = _XX - per_image(cx)
    w *= w
    dy = _YY - per_image(cy)
    dy *= dy
    w += dy
    w *= per_image(-0.5 / radius**2)
    np.exp(w, out=w)
    w *= 1.6
    np.minimum(w, 1.0, out=w)
    w *= per_image(rng.uniform(0.4, 1.0, n))

    # Background: smooth random colour blobs (a 4x4 grid upsampled), the object blended on top.
    grid = rng.uniform(0.15, 0.85, (n, 3, 4, 4)).astype(f32)
    img = _UP4 @ grid @ _UP4.T  # [n, 3, 32, 32]
    obj -= img
    obj *= w[:, None]
    img += obj

    # Distractor: a grating of random angle and frequency over the whole image.
    theta2 = rng.uniform(0.0, np.pi, n)
    k2 = 2 * np.pi * rng.uniform(2.5, 6.5, n) / _SIZE
    distract = np.sin(_XX * per_image(np.cos(theta2) * k2) + _YY * per_image(np.sin(theta2) * k2)
                      + per_image(rng.uniform(0.0, 2 * np.pi, n)))
    distract *= per_image(rng.uniform(0.0, 0.15, n))
    img += distract[:, None]

    # Horizontal flip, global contrast/brightness, uniform pixel noise (std 0.06), quantisation.
    flip = rng.random(n) < 0.5
    img[flip] = img[flip][..., ::-1]
    img *= rng.uniform(0.75, 1.25, (n, 1, 1, 1)).astype(f32)
    img += rng.normal(0.0, 0.05, (n, 1, 1, 1)).astype(f32)
    noise = np.frombuffer(rng.bytes(img.size), dtype=np.uint8).reshape(img.shape).astype(f32)
    noise -= 127.5
    noise *= 0.06 * np.sqrt(3.0) / 127.5
    img += noise
    img *= 255.0
    img += 0.5
    np.clip(img, 0.0, 255.0, out=img)
    return img.astype(np.uint8).reshape(n, 3 * _SIZE * _SIZE)


def _generate_split(n: int, seed: int, split_id: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` images with exactly balanced classes (as far as n allows), in shuffled order.

    Randomness comes from a SeedSequence of (seed, split): train and test never share images, and each
    chunk of images has its own child stream, so the result does not depend on how much memory is used.
    """
    children = np.random.SeedSequence([seed, split_id]).spawn(1 + (n + _CHUNK - 1) // _CHUNK)
    labels = np.arange(n) % len(CLASSES)
    np.random.default_rng(children[0]).shuffle(labels)
    data = np.empty((n, 3 * _SIZE * _SIZE), dtype=np.uint8)
    for i, child in enumerate(children[1:]):
        part = slice(i * _CHUNK, (i + 1) * _CHUNK)
        data[part] = _render(labels[part], np.random.default_rng(child))
    return data, labels


def _check_count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < _MIN_IMAGES:
        raise ValueError(f"{name} must be an integer >= {_MIN_IMAGES} (one image per class at least), got {value!r}")
    return int(value)


def _check_seed(seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    return int(seed)


def _write_generated(folder: Path, n_train: int, n_test: int, seed: int) -> None:
    folder.mkdir(parents=True)
    files: dict[str, str] = {}
    data, labels = _generate_split(n_train, seed, 0)
    bounds = np.linspace(0, n_train, len(_TRAIN_FILES) + 1).astype(int)
    for i, name in enumerate(_TRAIN_FILES):
        lo, hi = bounds[i], bounds[i + 1]
        files[name] = _write_pickle(folder / name, {
            "batch_label": f"training batch {i + 1} of {len(_TRAIN_FILES)} (generated, not CIFAR-10)",
            "labels": [int(c) for c in labels[lo:hi]],
            "data": data[lo:hi],
            "filenames": [f"generated_{CLASSES[c]}_train_{j:06d}.png" for j, c in zip(range(lo, hi), labels[lo:hi])],
        })
    data, labels = _generate_split(n_test, seed, 1)
    files[_TEST_FILE] = _write_pickle(folder / _TEST_FILE, {
        "batch_label": "testing batch 1 of 1 (generated, not CIFAR-10)",
        "labels": [int(c) for c in labels],
        "data": data,
        "filenames": [f"generated_{CLASSES[c]}_test_{j:06d}.png" for j, c in enumerate(labels)],
    })
    files[_META_FILE] = _write_pickle(folder / _META_FILE, {
        "num_cases_per_batch": int(bounds[1] - bounds[0]),
        "label_names": list(CLASSES),
        "num_vis": 3 * _SIZE * _SIZE,
    })
    marker = {
        "format": _GENERATED_FORMAT,
        "version": _GENERATED_VERSION,
        "seed": seed,
        "n_train": n_train,
        "n_test": n_test,
        "note": "generated by dlo.data.make_generated_cifar10: NOT real CIFAR-10",
        "md5": files,
    }
    # Written last: a folder without a valid marker is an unfinished write, never mistaken for a complete one.
    (folder / MARKER_NAME).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")


def read_generated_marker(folder: str | os.PathLike) -> dict:
    """The validated ``GENERATED.json`` of a generated ``cifar-10-batches-py`` folder.

    Checks the marker itself (present, JSON, our format and version, an md5 for every file). The data files
    are checked against those md5 sums when the dataset is opened (:class:`GeneratedCIFAR10`).
    Raises ValueError (FileNotFoundError if there is no marker) with one line saying what to do.
    """
    folder = Path(folder)
    path = folder / MARKER_NAME
    fix = "delete that folder and it is regenerated (or call make_generated_cifar10(..., overwrite=True))"
    if not path.is_file():
        raise FileNotFoundError(f"{folder} has no {MARKER_NAME}: it is not a dataset written by make_generated_cifar10")
    try:
        marker = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path} is unreadable or not JSON ({exc}); {fix}") from None
    if not isinstance(marker, dict) or marker.get("format") != _GENERATED_FORMAT:
        raise ValueError(f"{path} is not a {_GENERATED_FORMAT} marker; {fix}")
    if marker.get("version") != _GENERATED_VERSION:
        raise ValueError(f"{path} was written by generator version {marker.get('version')!r}, this dlo writes "
                         f"version {_GENERATED_VERSION}; {fix}")
    md5 = marker.get("md5")
    if not isinstance(md5, dict) or any(not isinstance(md5.get(name), str) for name in _ALL_FILES):
        raise ValueError(f"{path} lacks the md5 of some of {', '.join(_ALL_FILES)}; {fix}")
    for key in ("seed", "n_train", "n_test"):
        if not isinstance(marker.get(key), int):
            raise ValueError(f"{path} lacks an integer {key!r}; {fix}")
    return marker


def _files_match(folder: Path, marker: dict) -> bool:
    return all(check_integrity(str(folder / name), marker["md5"][name]) for name in _ALL_FILES)


def _marker_matches(marker: dict, seed: int, n_train: int, n_test: int) -> bool:
    return (marker["seed"], marker["n_train"], marker["n_test"]) == (seed, n_train, n_test)


def make_generated_cifar10(root: str | os.PathLike, n_train: int = 10000, n_test: int = 2000, seed: int = 0,
                           overwrite: bool = False) -> Path:
    """Write a generated dataset to ``<root>/cifar-10-batches-py/``; returns ``root`` (torchvision's root).

    The files are byte for byte the ``cifar-10-batches-py`` format: ``data_batch_1`` .. ``data_batch_5``
    (the ``n_train`` images split evenly), ``test_batch`` (``n_test`` images) and ``batches.meta``, each a
    pickle with ``labels``, ``data`` (uint8 ``[N, 3072]``, channel-major) and ``filenames``. So anything that
    reads CIFAR-10 reads them. ``GENERATED.json`` beside them records seed, sizes, generator version and the
    md5 of every file: it is how generated data is recognised and checked.

    The same seed and sizes give byte-identical files (with the same numpy), so a run is reproducible
    without shipping data. Classes are exactly balanced (as far as the sizes allow).

    If a matching generated dataset is already there (marker and md5 sums agree) it is kept, not rewritten.
    A different or damaged generated dataset is replaced only with ``overwrite=True``. A folder without a
    marker (real CIFAR-10, or anything else) is never overwritten. Writing goes to a temporary folder that is
    renamed at the end, so parallel processes (several ranks of a job) never see half-written files.
    """
    n_train = _check_count("n_train", n_train)
    n_test = _check_count("n_test", n_test)
    seed = _check_seed(seed)
    root = Path(root).expanduser()
    folder = root / BASE_FOLDER
    wanted = f"seed {seed}, {n_train} train / {n_test} test"

    if folder.exists():
        problem = _existing_problem(folder, seed, n_train, n_test)
        if problem is None:
            return root
        if problem == "not generated":
            raise FileExistsError(f"{folder} exists and was not written by make_generated_cifar10 (no {MARKER_NAME}: "
                                  f"real CIFAR-10?); it is never overwritten: choose another root")
        if not overwrite:
            raise FileExistsError(f"{folder} holds {problem}, not the requested {wanted}: pass overwrite=True "
                                  f"to replace it, or choose another root")

    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{BASE_FOLDER}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        _write_generated(tmp, n_train, n_test, seed)
        if folder.exists():  # overwrite=True: move the old one aside, then swap
            old = root / f".{BASE_FOLDER}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            folder.rename(old)
            shutil.rmtree(old, ignore_errors=True)
        try:
            tmp.rename(folder)
        except OSError:
            # Another process finished first: use its files if they are what we wanted.
            if _existing_problem(folder, seed, n_train, n_test) is None:
                return root
            raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return root


def _existing_problem(folder: Path, seed: int, n_train: int, n_test: int) -> str | None:
    """None if ``folder`` holds exactly the requested generated data; else a short description of what it holds."""
    if not (folder / MARKER_NAME).exists():
        return "not generated"
    try:
        marker = read_generated_marker(folder)
    except ValueError:
        return f"a generated dataset with an invalid {MARKER_NAME}"
    if not _marker_matches(marker, seed, n_train, n_test):
        return f"generated data with seed {marker['seed']}, {marker['n_train']} train / {marker['n_test']} test"
    if not _files_match(folder, marker):
        return "generated data whose files no longer match their md5 sums (changed or truncated)"
    return None


def generated_cache_root(n_train: int = 10000, n_test: int = 2000, seed: int = 0) -> Path:
    """Where :func:`cifar10` keeps a generated dataset: ``.cache/data/generated-cifar10-seed{seed}-{n_train}-{n_test}``."""
    return paths.CACHE_DIR / "data" / f"generated-cifar10-seed{seed}-{n_train}-{n_test}"


class GeneratedCIFAR10(CIFAR10):
    """torchvision's CIFAR10, reading a generated folder: only the md5 sums it checks are different.

    torchvision compares each file with the md5 of the real CIFAR-10, which generated files cannot match.
    Here the expected sums come from the folder's ``GENERATED.json``, and torchvision's own code does the
    checking and the reading. So the real and the generated dataset go through the same code path, and
    a changed or truncated generated file is still caught.
    """

    def __init__(self, root: str | os.PathLike, train: bool = True, transform=None, target_transform=None) -> None:
        folder = Path(root) / BASE_FOLDER
        marker = read_generated_marker(folder)
        md5 = marker["md5"]
        # Instance attributes shadow the class tables of real md5 sums, before torchvision's __init__ reads them.
        self.train_list = [[name, md5[name]] for name in _TRAIN_FILES]
        self.test_list = [[_TEST_FILE, md5[_TEST_FILE]]]
        self.meta = {**CIFAR10.meta, "md5": md5[_META_FILE]}
        self.marker = marker
        try:
            super().__init__(root, train=train, transform=transform, target_transform=target_transform,
                             download=False)
        except RuntimeError:
            bad = [n for n in _ALL_FILES if not check_integrity(str(folder / n), md5[n])]
            raise RuntimeError(f"generated data in {folder} does not match its {MARKER_NAME} (changed or missing: "
                               f"{', '.join(bad) or 'unknown'}); delete that folder and it is regenerated") from None

    def download(self) -> None:  # generated data is made, never downloaded
        raise RuntimeError("generated data cannot be downloaded: use make_generated_cifar10()")


# --------------------------------------------------------------------------------------------------------
# The entry point
# --------------------------------------------------------------------------------------------------------

def _open_real(root: Path, train: bool, transform, download: bool) -> CIFAR10:
    folder = root / BASE_FOLDER
    if download:
        try:
            root.mkdir(parents=True, exist_ok=True)
            CIFAR10(str(root), train=train, download=True)  # no-op when the files are already intact
        except Exception as exc:  # noqa: BLE001 - any network/disk failure gets the same advice
            raise RuntimeError(f"downloading CIFAR-10 into {root} failed ({type(exc).__name__}: {exc}); compute nodes "
                               f"usually have no internet: download on a login node, or leave download=False to "
                               f"use the generated dataset") from None
    try:
        return CIFAR10(str(root), train=train, transform=transform, download=False)
    except RuntimeError:
        pass
    expected = {name: md5 for name, md5 in CIFAR10.train_list + CIFAR10.test_list}
    expected[_META_FILE] = CIFAR10.meta["md5"]
    missing = [n for n in _ALL_FILES if not (folder / n).is_file()]
    corrupt = [n for n in _ALL_FILES if n not in missing and not check_integrity(str(folder / n), expected[n])]
    what = "; ".join(part for part in (missing and f"missing {', '.join(missing)}",
                                       corrupt and f"md5 mismatch in {', '.join(corrupt)}") if part)
    if (folder / MARKER_NAME).exists():
        hint = (f"this folder holds generated data ({MARKER_NAME}), not real CIFAR-10: use generated=None or "
                f"generated=True to read it as generated")
    else:
        hint = "download CIFAR-10 again (download=True, on a machine with internet) or point data_dir elsewhere"
    raise RuntimeError(f"CIFAR-10 in {folder} fails torchvision's md5 check ({what or 'unreadable'}): {hint}")


def _open_cached_generated(n_train: int, n_test: int, seed: int) -> Path:
    root = generated_cache_root(n_train, n_test, seed)
    folder = root / BASE_FOLDER
    if folder.exists():
        problem = _existing_problem(folder, seed, n_train, n_test)
        if problem is None:
            return root
        if problem == "not generated":
            raise FileExistsError(f"{folder} is in dlo's cache but has no {MARKER_NAME}: delete it and run again")
        warnings.warn(f"regenerating {folder}: it held {problem}", stacklevel=3)
        return make_generated_cifar10(root, n_train, n_test, seed, overwrite=True)
    return make_generated_cifar10(root, n_train, n_test, seed)


def cifar10(split: str = "train", data_dir: str | os.PathLike | None = None, transform=None, *,
            generated: bool | None = None, download: bool = False, n_train: int = 10000, n_test: int = 2000,
            seed: int = 0, verbose: bool = True) -> CIFAR10:
    """The CIFAR-10 ``split`` ("train" or "test") as a torchvision dataset of ``(image, label)`` pairs.

    ``generated`` chooses the data:

    * ``None`` (default): real CIFAR-10 if it is found (``data_dir``, ``$DLO_DATA_DIR``, ``$DSDIR``,
      ``<project>/data``), else the generated dataset. A folder you name must hold the data (else
      FileNotFoundError), and real data that fails torchvision's md5 check is an error, never replaced.
    * ``True``: the generated dataset, ``n_train`` / ``n_test`` images from ``seed``, kept in
      :func:`generated_cache_root` (or in ``data_dir`` if given). Written on first use (about a second
      per 10 000 images), reused afterwards.
    * ``False``: real CIFAR-10 or an error saying where to put it.

    ``download=True`` lets torchvision fetch CIFAR-10 (needs internet) into ``data_dir``, ``$DLO_DATA_DIR``
    or ``<project>/data``. ``n_train``, ``n_test`` and ``seed`` only shape generated data; real CIFAR-10 is
    always 50 000 / 10 000 images, and a generated folder you point at (``data_dir``, ``$DLO_DATA_DIR``) is
    read as it was written (its ``GENERATED.json`` says how; ``source`` repeats it). ``transform`` is applied to each PIL image (see :func:`train_transform`).

    The dataset carries ``source`` (one line saying which data this is and where it lives),
    ``is_generated`` and ``split``; with ``verbose`` the ``source`` line is printed, so every run's log
    states what it trained on.
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if generated not in (None, True, False):
        raise ValueError(f"generated must be None (real if found), True or False, got {generated!r}")
    if generated is True and download:
        raise ValueError("download=True fetches real CIFAR-10 and generated=True asks for generated data: pick one")
    n_train = _check_count("n_train", n_train)
    n_test = _check_count("n_test", n_test)
    seed = _check_seed(seed)
    train = split == "train"

    if generated is True:
        if data_dir is None:
            root = _open_cached_generated(n_train, n_test, seed)
        else:
            base = Path(data_dir).expanduser()
            root = make_generated_cifar10(base.parent if base.name == BASE_FOLDER else base, n_train, n_test, seed)
        dataset: CIFAR10 = GeneratedCIFAR10(root, train=train, transform=transform)
    else:
        root, origin = _find(data_dir, must_exist=not download)
        if root is None and download:
            root, origin = _download_root(data_dir), "download"
        if root is None:
            if generated is False:
                dsdir = os.environ.get("DSDIR")
                raise FileNotFoundError(
                    f"no real CIFAR-10 found (data_dir and DLO_DATA_DIR unset, "
                    f"{'none under $DSDIR=' + dsdir if dsdir else '$DSDIR unset'}, none in {paths.ROOT / 'data'}): "
                    f"pass data_dir= the folder containing {BASE_FOLDER}, set DLO_DATA_DIR, or use download=True")
            dataset = GeneratedCIFAR10(_open_cached_generated(n_train, n_test, seed), train=train, transform=transform)
        elif download and (root / BASE_FOLDER / MARKER_NAME).exists():
            raise ValueError(f"{root / BASE_FOLDER} holds generated data ({MARKER_NAME}): download real CIFAR-10 "
                             f"into another folder (data_dir=...)")
        elif generated is None and (root / BASE_FOLDER / MARKER_NAME).exists():
            dataset = GeneratedCIFAR10(root, train=train, transform=transform)  # a generated folder, named by the user
        else:
            dataset = _open_real(root, train, transform, download)

    folder = Path(dataset.root) / BASE_FOLDER
    if isinstance(dataset, GeneratedCIFAR10):
        m = dataset.marker
        dataset.source = (f"generated CIFAR-format data (seed {m['seed']}, {m['n_train']} train / {m['n_test']} test; "
                          f"NOT real CIFAR-10) at {folder}, {split} split")
        dataset.is_generated = True
    else:
        dataset.source = f"real CIFAR-10 from {folder} ({len(dataset)} {split} images)"
        dataset.is_generated = False
    dataset.split = split
    if verbose:
        print(f"[dlo.data] {dataset.source}", flush=True)
    return dataset


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


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


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
    if not _is_int(batch_size) or batch_size <= 0:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if not _is_int(num_workers) or num_workers < 0:
        raise ValueError(f"num_workers must be an integer >= 0 (0 = load in the main process), got {num_workers!r}")
    if num_workers == 0 and prefetch_factor is not None:
        raise ValueError(f"prefetch_factor={prefetch_factor} needs worker processes: set num_workers > 0, "
                         f"or leave prefetch_factor=None")
    if num_workers == 0 and persistent_workers:
        raise ValueError("persistent_workers=True needs worker processes: set num_workers > 0, "
                         "or leave persistent_workers=False")
    if prefetch_factor is not None and (not _is_int(prefetch_factor) or prefetch_factor <= 0):
        raise ValueError(f"prefetch_factor must be a positive integer (batches per worker), got {prefetch_factor!r}")
    if seed is not None and generator is not None:
        raise ValueError("give seed or generator, not both (seed just builds a seeded generator)")
    if seed is not None and not _is_int(seed):
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
    if not _is_int(n_batches) or n_batches <= 0:
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
    if not _is_int(batch_size) or batch_size <= 0:
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
                    channels_last: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ``(images [B, 3, 32, 32] float32 ~ N(0, 1), labels [B] int64 in 0..9)`` for pure compute timing.

    Already "normalised", with no data behind it: the step time measured on it is what the model costs,
    whatever the disk, the loader or the dataset. Drawn on the CPU from ``seed``, then moved, so the values
    are the same on every device.
    """
    if not _is_int(batch_size) or batch_size <= 0:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    gen = torch.Generator().manual_seed(int(seed))
    images = torch.randn(batch_size, 3, _SIZE, _SIZE, generator=gen)
    labels = torch.randint(0, len(CLASSES), (batch_size,), generator=gen)
    return _to_device((images, labels), torch.device(device), channels_last)
