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
quiet switch to generated images. Real data is checked against torchvision's md5 sums and read by
:class:`~dlo.data.format.CIFAR10Files` (torchvision's ``CIFAR10`` without ``pickle.load``: no code in a data
file can run).

When no real data is found (compute nodes have no internet, and CIFAR-10 cannot be downloaded there),
:func:`make_generated_cifar10` writes a *generated* dataset in the exact ``cifar-10-batches-py`` pickle
format, and the same dataset class reads it; only the md5 list differs (it comes from the generated
folder's ``GENERATED.json`` marker instead of torchvision's table). Generated images are class-dependent
textures, learnable but not trivial, so the lessons on speed (throughput, loaders, mixed precision,
compilation, distribution) behave as on CIFAR-10; accuracies are *not* CIFAR-10 accuracies.

Import ``dlo`` (or ``dlo.data``) before ``torchvision``: the package prepares torchvision's import.
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path


from dlo.runtime import paths

from torchvision.datasets import CIFAR10  # noqa: E402
from torchvision.datasets.utils import check_integrity  # noqa: E402
from dlo.data.format import BASE_FOLDER, MARKER_NAME, _ALL_FILES, _META_FILE, CIFAR10Files
from dlo.data.generated import GeneratedCIFAR10, _check_count, _check_seed, _existing_problem, generated_cache_root, make_generated_cifar10
# Sub-folders of a data directory (or of $DSDIR) that may hold cifar-10-batches-py.
SEARCH_LAYOUTS: tuple[str, ...] = (
    "", "CIFAR-10", "cifar-10", "CIFAR10", "cifar10", "CIFAR-10-python", "cifar-10-python",
    "torchvision", "pytorch",
)


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
# The entry point
# --------------------------------------------------------------------------------------------------------

def _open_real(root: Path, train: bool, transform, download: bool) -> CIFAR10:
    folder = root / BASE_FOLDER
    if download:
        try:
            root.mkdir(parents=True, exist_ok=True)
            CIFAR10Files(str(root), train=train, download=True)  # no download when the files are already intact
        except Exception as exc:  # noqa: BLE001 - any network/disk failure gets the same advice
            raise RuntimeError(f"downloading CIFAR-10 into {root} failed ({type(exc).__name__}: {exc}); compute nodes "
                               f"usually have no internet: download on a login node, or leave download=False to "
                               f"use the generated dataset") from None
    try:
        return CIFAR10Files(str(root), train=train, transform=transform, download=False)
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
