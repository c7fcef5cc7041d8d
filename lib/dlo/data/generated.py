"""Generated CIFAR-format data: images of ten procedural classes written in the exact
``cifar-10-batches-py`` format (a marker file says they are generated), so every loading path is exercised
without the real dataset.
"""
from __future__ import annotations

import json
import os
import pickle
import shutil
import struct
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from dlo.runtime import paths

from torchvision.datasets import CIFAR10  # noqa: E402
from torchvision.datasets.utils import check_integrity  # noqa: E402
from dlo.data.format import (BASE_FOLDER, CLASSES, MARKER_NAME, _ALL_FILES, _META_FILE, _NP_RECONSTRUCT, _TEST_FILE,
                             _TRAIN_FILES, CIFAR10Files, _md5)

_GENERATED_FORMAT = "dlo-generated-cifar10"
# Bump when the generator's output changes: caches written by an older version are then regenerated.
_GENERATED_VERSION = 1
_MIN_IMAGES = 10  # at least one image per class


# --------------------------------------------------------------------------------------------------------
# Writing the cifar-10-batches-py format
# --------------------------------------------------------------------------------------------------------

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
        "note": "generated by dlo.data.generated.make_generated_cifar10: NOT real CIFAR-10",
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


class GeneratedCIFAR10(CIFAR10Files):
    """The CIFAR10 dataset class of real data (:class:`~dlo.data.format.CIFAR10Files`), reading a generated
    folder: only the md5 sums it checks are different.

    torchvision compares each file with the md5 of the real CIFAR-10, which generated files cannot match.
    Here the expected sums come from the folder's ``GENERATED.json``, and the same code as for real data does
    the checking and the reading. So the real and the generated dataset go through the same code path, and
    a changed or truncated generated file is still caught. Whoever can write the folder can also write its
    md5 sums: that is why the files are read without unpickling arbitrary objects (a crafted file is refused).
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
