"""A validation set held out of the TRAINING split: the one place where the workbook makes it.

Why a third set. Every choice made by looking at a score (a learning rate, a pruned trial, the epoch at
which to stop, the best of several optimizers or recipes) fits that choice to the images it was scored on,
a little. Score the choice on the test split and the test accuracy you then report has been *selected*: it
is optimistic, the more so the more candidates were compared and the smaller the test set. So every choice
is scored on a validation set carved out of the training split, and the test split is touched once, at the
end, to report the configuration that was chosen.

The split is deterministic: :func:`split_indices` draws one seeded permutation of the training indices;
the same dataset size, validation size and seed give the same split in every notebook and every run, and
the validation images are never trained on.

- :func:`split_indices`: ``(train_indices, val_indices)`` of a training split of ``n`` images;
- :func:`holdout`: the two parts of a training dataset as :class:`HeldOut` subsets (the validation part can
  come from the same split opened with the evaluation transform: no augmentation when scoring);
- :func:`cifar10_train_val`: CIFAR-10's training split (real or generated, see :func:`dlo.data.cifar.cifar10`)
  opened twice, with the training and the evaluation transform, and split.
"""
from __future__ import annotations

import os
from typing import Any, Sequence

import torch
from torch.utils.data import Dataset, Subset

from dlo.runtime.validate import is_int
from dlo.data.cifar import cifar10

#: Share of the training split held out for validation when no size is given.
DEFAULT_VAL_FRACTION = 0.1
#: Seed of the permutation that picks the validation images (the same in every notebook).
SPLIT_SEED = 0


def _val_count(n: int, val: int | float) -> int:
    if is_int(val):
        n_val = int(val)
    elif isinstance(val, float) and 0 < val < 1:
        n_val = max(1, round(n * val))
    else:
        raise ValueError(f"the validation size must be a number of images (an integer >= 1) or a fraction in (0, 1), "
                         f"got {val!r}")
    if not 1 <= n_val < n:
        raise ValueError(f"cannot hold out {n_val} validation images from a training split of {n}: ask for between 1 "
                         f"and {n - 1}, or use more training images")
    return n_val


def split_indices(n: int, val: int | float = DEFAULT_VAL_FRACTION, seed: int = SPLIT_SEED) -> tuple[list[int], list[int]]:
    """``(train_indices, val_indices)``: the ``n`` indices of a training split cut in two, disjoint and together
    ``range(n)``. ``val`` is a number of images or a fraction of ``n``. The validation indices are the first
    ones of a permutation drawn from ``seed`` (a CPU ``torch.Generator``: the same on every machine); both lists
    are returned sorted."""
    if not is_int(n) or n < 2:
        raise ValueError(f"n (the size of the training split) must be an integer >= 2, got {n!r}")
    if not is_int(seed) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    n_val = _val_count(int(n), val)
    order = torch.randperm(int(n), generator=torch.Generator().manual_seed(int(seed))).tolist()
    return sorted(order[n_val:]), sorted(order[:n_val])


class HeldOut(Subset):
    """A part of a training dataset (a ``torch.utils.data.Subset``) that still says what it is: ``indices``
    (into the training split), ``targets`` (their labels), ``part`` ("train" or "val"), and the dataset's
    ``source`` and ``is_generated`` (see :func:`dlo.data.cifar.cifar10`)."""

    def __init__(self, dataset: Dataset, indices: Sequence[int], part: str) -> None:
        super().__init__(dataset, list(indices))
        self.part = part
        targets = getattr(dataset, "targets", None)
        self.targets = [int(targets[i]) for i in self.indices] if targets is not None else None
        base = getattr(dataset, "source", None)
        self.source = (f"{base}; {'validation part' if part == 'val' else 'training part'} ({len(self.indices)} images "
                       f"of the training split)") if base else None
        self.is_generated = getattr(dataset, "is_generated", None)
        self.split = "train"  # both parts come from the training split, never from the test split


def holdout(train_set: Dataset, val: int | float = DEFAULT_VAL_FRACTION, *, seed: int = SPLIT_SEED,
            eval_set: Dataset | None = None) -> tuple[HeldOut, HeldOut]:
    """``(train_part, val_part)`` of ``train_set`` (:func:`split_indices`). ``eval_set``: the same training
    split opened with the evaluation transform (same images, same order, no augmentation); the validation
    part is taken from it, so the validation score is not blurred by random crops. Refuses a test split."""
    for what, ds in (("train_set", train_set), ("eval_set", eval_set)):
        if ds is not None and getattr(ds, "split", "train") != "train":
            raise ValueError(f"{what} is the {getattr(ds, 'split')!r} split: a validation set is held out of the "
                             f"TRAINING split (the test split is kept for the final report)")
    if eval_set is not None and len(eval_set) != len(train_set):
        raise ValueError(f"eval_set has {len(eval_set)} images and train_set {len(train_set)}: give the same training "
                         f"split opened twice (with the training and with the evaluation transform)")
    train_idx, val_idx = split_indices(len(train_set), val, seed)
    return HeldOut(train_set, train_idx, "train"), HeldOut(eval_set if eval_set is not None else train_set, val_idx, "val")


def cifar10_train_val(val: int | float = DEFAULT_VAL_FRACTION, data_dir: str | os.PathLike | None = None,
                      train_transform: Any = None, eval_transform: Any = None, *, seed: int = SPLIT_SEED,
                      **cifar_kw: Any) -> tuple[HeldOut, HeldOut]:
    """CIFAR-10's training split cut into ``(train_part, val_part)`` (:func:`holdout`): the training part with
    ``train_transform``, the validation part with ``eval_transform``. ``cifar_kw`` goes to
    :func:`dlo.data.cifar.cifar10` (``generated``, ``n_train``, ``n_test``, ``verbose``...). Generated data: ask
    for ``n_train`` = the training images you want + the validation images, so the training part keeps its size."""
    verbose = cifar_kw.pop("verbose", True)
    train = cifar10("train", data_dir, train_transform, verbose=verbose, **cifar_kw)
    plain = cifar10("train", data_dir, eval_transform, verbose=False, **cifar_kw)
    train_part, val_part = holdout(train, val, seed=seed, eval_set=plain)
    if verbose:
        print(f"[dlo.data] validation: {len(val_part)} images held out of the training split (seed {seed}); "
              f"{len(train_part)} left to train on; the test split is not used for any choice", flush=True)
    return train_part, val_part
