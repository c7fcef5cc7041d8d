"""The data of a race attempt: real CIFAR-10 or generated data (said in the record), either preloaded on the
device and augmented there in whole batches (random crop + flip without a Python loop over images), or fed by
a DataLoader with torchvision transforms. Everything here runs on the race clock.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

import torch
from torch.nn import functional as F

from dlo.data.format import CIFAR10_MEAN, CIFAR10_STD
from dlo import data
from dlo.lessons.race_recipe import Recipe, SMOKE_DATA
from dlo.runtime.validate import is_int



# --------------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------------

@dataclass
class RaceData:
    """The data of one attempt: batches come from :meth:`train_batches` and :meth:`test_batches`."""

    source: str
    is_generated: bool
    n_train: int
    n_test: int
    mode: str
    train_x: torch.Tensor | None = None  # preload: normalised float32 images on the device
    train_y: torch.Tensor | None = None
    test_x: torch.Tensor | None = None
    test_y: torch.Tensor | None = None
    train_loader: Any = None  # loader mode
    test_loader: Any = None
    split: str = "test"  # what test_x / test_loader hold: the "test" set, or a "validation" split of the training set

def require_data(data_dir=None, generated: bool | None = False) -> None:
    """Fail in one line, before anything is trained or compiled, when the race has no data set: real CIFAR-10
    is required (``generated=False``) and not found, or a folder that was named does not hold it."""

    if generated not in (None, True, False):
        raise ValueError(f"generated must be False (real CIFAR-10 required), True (generated data) or None "
                         f"(real if found, else generated), got {generated!r}")
    if generated is True:
        return
    try:
        found = data.find_cifar10(data_dir)
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"the race needs a data set: {exc}") from None
    if found is None and generated is False:
        raise FileNotFoundError(
            "the race needs a data set and no real CIFAR-10 was found (data_dir and $DLO_DATA_DIR unset, none under "
            "$DSDIR or <project>/data): pass data_dir= / --data-dir the folder holding cifar-10-batches-py, set "
            "DLO_DATA_DIR, or allow generated data explicitly (generated=True / --generated, the smoke race, whose "
            "target is not a CIFAR-10 accuracy)")

def _open_datasets(data_dir, generated: bool | None, n_train: int, n_test: int, train_transform, test_transform,
                   verbose: bool, validation: bool = False):
    """The training set, and the evaluation set: the test set, or (``validation``) the training file opened a
    second time with the evaluation transform (the held-out images are cut from it): the test file is not read."""
    require_data(data_dir, generated)
    kw = dict(generated=generated, n_train=n_train, n_test=n_test)
    train = data.cifar10("train", data_dir, train_transform, verbose=verbose, **kw)
    evaluation = data.cifar10("train" if validation else "test", data_dir, test_transform, verbose=False, **kw)
    if generated is None and train.is_generated and verbose:
        print("[dlo.lessons.race] no real CIFAR-10 found: racing on GENERATED data (generated=None allows it); "
              "its accuracies are not CIFAR-10 accuracies", flush=True)
    return train, evaluation

def _normalise(images_uint8_nhwc: Any, device: torch.device, channels_last: bool) -> torch.Tensor:

    x = torch.as_tensor(images_uint8_nhwc).to(device, non_blocking=True)  # copy bytes, convert on the device
    x = x.permute(0, 3, 1, 2).float().div_(255)
    mean = torch.tensor(CIFAR10_MEAN, device=device).view(1, 3, 1, 1)
    std = torch.tensor(CIFAR10_STD, device=device).view(1, 3, 1, 1)
    x = (x - mean) / std
    return x.contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)

def load_race_data(recipe: Recipe, device: torch.device | str, *, data_dir=None, generated: bool | None = False,
                   n_train: int | None = None, n_test: int | None = None, validation: int | None = None,
                   verbose: bool = True) -> RaceData:
    """Open the data as the recipe asks. Called on the clock by :func:`run_race`.

    ``generated``: False = real CIFAR-10 required (else a one-line FileNotFoundError saying where to put
    it), True = generated data (``n_train`` / ``n_test`` images, default :data:`SMOKE_DATA`), None = real
    if found, else generated (said in the log). ``n_train`` / ``n_test`` can also take the first images of
    real CIFAR-10 (all of them by default).

    ``validation``: hold out the **last** ``validation`` of the ``n_train`` training images, never train on
    them, and evaluate on them instead of the test set (``split == "validation"``; the test file is not read,
    ``n_test`` is then the number of held-out images). That is where a recipe's choices are made.
    """

    device = torch.device(device)
    n_gen_train = n_train or SMOKE_DATA["n_train"]
    n_gen_test = n_test or SMOKE_DATA["n_test"]
    for key, value in (("n_train", n_train), ("n_test", n_test), ("validation", validation)):
        if value is not None and (not is_int(value) or value < 10):
            raise ValueError(f"{key} must be an integer >= 10 (or None: the whole set), got {value!r}")
    if validation is not None and n_test is not None:
        raise ValueError("validation= evaluates on held-out training images and never reads the test set: "
                         "do not pass n_test= with it")
    held = validation or 0
    split = "validation" if held else "test"

    def sizes(train, evaluation) -> tuple[int, int, range]:
        n_read = min(n_train or len(train), len(train))
        if held and n_read - held < recipe.batch_size:
            raise ValueError(f"validation={held} leaves {n_read - held} of the {n_read} training images to train on, "
                             f"fewer than one batch of {recipe.batch_size}: hold out fewer images")
        if held:
            return n_read - held, held, range(n_read - held, n_read)
        n_te = min(n_test or len(evaluation), len(evaluation))
        return n_read, n_te, range(n_te)

    if recipe.data == "preload":
        train, evaluation = _open_datasets(data_dir, generated, n_gen_train, n_gen_test, None, None, verbose, bool(held))
        n_tr, n_te, rows = sizes(train, evaluation)
        out = RaceData(train.source, train.is_generated, n_tr, n_te, "preload", split=split)
        out.train_x = _normalise(train.data[:n_tr], device, recipe.channels_last)
        out.train_y = torch.as_tensor(train.targets[:n_tr]).to(device)
        out.test_x = _normalise(evaluation.data[rows.start:rows.stop], device, recipe.channels_last)
        out.test_y = torch.as_tensor(evaluation.targets[rows.start:rows.stop]).to(device)
        if n_tr < recipe.batch_size:
            raise ValueError(f"batch_size={recipe.batch_size} is more than the {n_tr} training images: use a smaller batch")
        return out
    from torch.utils.data import Subset
    from torchvision.transforms import v2

    steps: list = [v2.ToImage()]
    if recipe.crop_padding:
        steps.append(v2.RandomCrop(32, padding=recipe.crop_padding, padding_mode="reflect"))
    if recipe.flip:
        steps.append(v2.RandomHorizontalFlip())
    steps += [v2.ToDtype(torch.float32, scale=True), v2.Normalize(data.CIFAR10_MEAN, data.CIFAR10_STD)]
    train, evaluation = _open_datasets(data_dir, generated, n_gen_train, n_gen_test, v2.Compose(steps),
                                       data.test_transform(), verbose, bool(held))
    n_tr, n_te, rows = sizes(train, evaluation)
    if n_tr < recipe.batch_size:
        raise ValueError(f"batch_size={recipe.batch_size} is more than the {n_tr} training images: use a smaller batch")
    out = RaceData(train.source, train.is_generated, n_tr, n_te, "loader", split=split)
    workers = recipe.num_workers
    out.train_loader = data.make_loader(
        Subset(train, range(n_tr)) if n_tr < len(train) else train, recipe.batch_size, shuffle=True,
        num_workers=workers, pin_memory=device.type == "cuda", drop_last=True, seed=recipe.seed,
        persistent_workers=workers > 0)
    out.test_loader = data.make_loader(
        Subset(evaluation, rows) if len(rows) < len(evaluation) else evaluation, recipe.eval_batch_size,
        shuffle=False, num_workers=workers, pin_memory=device.type == "cuda", persistent_workers=workers > 0)
    return out

def random_crop_flip(images: torch.Tensor, padding: int, flip: bool, generator: torch.Generator | None = None) -> torch.Tensor:
    """The classic CIFAR augmentation for a whole batch on its device, without a Python loop over images.

    Each image is padded by ``padding`` pixels (reflection), a random 32x32 window is taken (a shift of up to
    ``padding`` pixels in each direction) and, with ``flip``, mirrored with probability 1/2. The windows are
    read with one indexing operation (a gather), so this costs a few kernels per batch, not one per image.
    """
    b, c, h, w = images.shape
    out = images
    if padding:
        padded = F.pad(images, (padding, padding, padding, padding), mode="reflect")
        dy = torch.randint(0, 2 * padding + 1, (b,), device=images.device, generator=generator)
        dx = torch.randint(0, 2 * padding + 1, (b,), device=images.device, generator=generator)
        rows = (dy[:, None] + torch.arange(h, device=images.device))[:, None, :, None]  # [B, 1, H, 1]
        cols = (dx[:, None] + torch.arange(w, device=images.device))[:, None, None, :]  # [B, 1, 1, W]
        bi = torch.arange(b, device=images.device)[:, None, None, None]
        ci = torch.arange(c, device=images.device)[None, :, None, None]
        out = padded[bi, ci, rows, cols]
    if flip:
        mirror = torch.rand(b, device=images.device, generator=generator) < 0.5
        out = torch.where(mirror[:, None, None, None], out.flip(-1), out)
    if images.is_contiguous(memory_format=torch.channels_last) and not images.is_contiguous():
        out = out.contiguous(memory_format=torch.channels_last)
    return out

def _train_batches(d: RaceData, recipe: Recipe, generator: torch.Generator) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
    """One epoch of preloaded training batches, shuffled and augmented on the device. ``generator`` (the
    loop's, on the CPU, seeded by the run's seed and the epoch) seeds a generator on the data's device."""
    device = d.train_x.device
    gen = torch.Generator(device=device).manual_seed(int(torch.randint(2**62, (1,), generator=generator)))
    n = d.train_x.shape[0]
    order = torch.randperm(n, device=device, generator=gen)
    for i in range(n // recipe.batch_size):  # drop the last partial batch: one shape, no recompilation
        idx = order[i * recipe.batch_size:(i + 1) * recipe.batch_size]
        yield random_crop_flip(d.train_x[idx], recipe.crop_padding, recipe.flip, gen), d.train_y[idx]

def _test_batches(d: RaceData, recipe: Recipe) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
    if d.mode == "loader":
        yield from d.test_loader
        return
    for i in range(0, d.test_x.shape[0], recipe.eval_batch_size):
        yield d.test_x[i:i + recipe.eval_batch_size], d.test_y[i:i + recipe.eval_batch_size]
