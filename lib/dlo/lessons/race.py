"""The CIFAR-10 race: wall-clock time to a target test accuracy, with a leaderboard.

A *recipe* (:class:`Recipe`) is everything that decides how fast a model learns: the network and its
width, the batch size, the optimizer, its schedule and learning rate, label smoothing, mixed precision,
memory layout, compilation, and how the data reaches the model. :func:`run_race` trains with it epoch by
epoch, measures the test accuracy after every epoch, and stops as soon as the target is reached.

The rules of the clock (also stored in every record, see :data:`TIMING_RULES`):

* **Data loading counts.** The clock starts before the dataset is read from disk. With
  ``data="preload"`` the whole dataset is read, normalised and copied to the device once (counted), then
  augmented there batch by batch (random crop + horizontal flip on the device); with ``data="loader"``
  a ``torch.utils.data.DataLoader`` with torchvision transforms feeds every batch (counted, of course).
* **Evaluation counts.** The race needs the test accuracy after each epoch to know when to stop, so that
  time is on the clock (airbench only counts its final evaluation, since it trains for a fixed number of
  epochs; here the stopping rule is part of the race). ``eval_s`` in the record says how much of the
  total it was.
* **Compilation counts, unless the recipe says** ``exclude_compile=True``: then the model is compiled
  and warmed up (a few steps on random data, in training and evaluation mode, after which the weights
  and the optimizer are restored) *before* the clock starts; that warm-up is timed on its own and
  reported as ``compile_s``, next to ``time_to_target_s`` (without it) and
  ``time_to_target_with_compile_s`` (with it).
* **Device start-up does not count**: the CUDA context is created before the clock starts (a one-off
  cost of the process, not of the recipe).
* Every reading of the clock comes after :func:`dlo.runtime.device.synchronize`: the GPU has finished the work.

Real CIFAR-10 or generated data: the race on real CIFAR-10 (target 94 %, :data:`REAL_TARGET`) needs the
data (``data_dir=``, ``$DLO_DATA_DIR``, ``$DSDIR``, ``<project>/data``); when it is missing the race stops
with one line saying where to put it. Generated CIFAR-format data (see :mod:`dlo.data`) is used only when
asked (``generated=True``, the smoke profile) or allowed as a fallback (``generated=None``), and the record
says so; its accuracies are not CIFAR-10 accuracies, so its race has its own target
(:data:`SMOKE_TARGET`).

``python -m dlo race --recipe reference --target 0.94 --data-dir DIR`` runs one attempt without Jupyter.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import math
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable, Sequence

import torch
from torch import nn
from torch.nn import functional as F

from dlo.measure.bench import environment_info, save_json
from dlo.runtime.device import synchronize
from dlo.training.optim import OPTIMIZERS, SCHEDULES, make_optimizer
from dlo.models.resnets import resnet9, resnet18_cifar
from dlo.training.step import amp_dtype, make_grad_scaler, make_train_step, prepare_model
from dlo.training.callbacks import Callback, StopAtTarget
from dlo.training.config import TrainConfig
from dlo.training.evaluate import evaluate
from dlo.training.loop import train
from dlo.lessons.leaderboard import append_to_leaderboard
from dlo.lessons.leaderboard import check_target, check_writable
from dlo.data.format import CIFAR10_MEAN, CIFAR10_STD
from dlo.data.loaders import Batches
from dlo import data
from dlo.data.cifar import find_cifar10
from dlo.runtime.device import pick_device

REAL_TARGET = 0.94  # the classic race: 94 % test accuracy on real CIFAR-10
# The smoke race: generated data (NOT CIFAR-10), a tiny network on a CPU. Its target is a level the smoke
# recipe reaches in well under a minute on two CPU cores; it says nothing about CIFAR-10.
SMOKE_TARGET = 0.50
SMOKE_DATA = {"n_train": 2048, "n_test": 500}  # generated images (train / test) of the smoke race

DATA_MODES = ("preload", "loader")
TIMING_RULES = ("clock starts before the dataset is read; data loading (and preloading to the device), model "
                "building, training, and the evaluation after every epoch are counted; torch.compile's first "
                "calls are counted unless the recipe sets exclude_compile (then timed apart as compile_s); "
                "device start-up (CUDA context) is not counted; every clock reading follows a synchronize")


# --------------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------------

MODELS: dict[str, Callable[..., nn.Module]] = {"resnet9": resnet9, "resnet18": resnet18_cifar}


# --------------------------------------------------------------------------------------------------
# The recipe
# --------------------------------------------------------------------------------------------------

def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass
class Recipe(TrainConfig):
    """Everything an attempt at the race chooses: a :class:`dlo.training.config.TrainConfig` (optimizer,
    schedule, ``lr``, ``warmup_frac``, ``amp``, ``channels_last``, ``compile``, ``tta``, ``seed`` ... each
    documented there, all usable here: EMA, progressive resizing, label smoothing) plus the race's own fields
    below. Invalid values raise a one-line ``ValueError``.

    ``epochs`` is the schedule's length (the learning rate reaches its end value after ``epochs`` epochs); the
    race stops earlier when the target is reached. ``tta`` is the one test-time augmentation of the package
    (:func:`dlo.training.evaluate.evaluate`: mean of the softmax of the image and of its mirror).
    """

    name: str = "baseline"
    """Names the attempt on the leaderboard."""
    model: str = "resnet18"
    """A name of :data:`MODELS`."""
    width: int = 64
    """Channels of the network's first stage."""
    batch_size: int = 256
    """Training batch size."""
    epochs: int = 30
    lr: float = 0.1
    warmup_frac: float | None = 0.25
    compile_mode: str | None = None
    """torch.compile's mode (None: default)."""
    compile_backend: str = "inductor"
    """torch.compile's backend."""
    exclude_compile: bool = False
    """Compile and warm up before the clock starts (timed apart as ``compile_s``, see the module's rules)."""
    data: str = "loader"
    """'preload' (whole dataset on the device, augmented there) or 'loader' (a DataLoader, torchvision transforms)."""
    num_workers: int = 0
    """DataLoader workers (data='loader' only)."""
    flip: bool = True
    """Random horizontal flip of the training images."""
    crop_padding: int = 4
    """Random crop after padding by that many pixels (0: no crop)."""
    eval_batch_size: int = 1000
    """Batch size of the evaluation."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"Recipe.name must be a non-empty string (it names the attempt on the leaderboard), got {self.name!r}")
        if self.model not in MODELS:
            raise ValueError(f"unknown model {self.model!r}: use one of {', '.join(MODELS)}")
        for key in ("width", "batch_size", "epochs", "eval_batch_size"):
            value = getattr(self, key)
            if not _is_int(value) or value < 1:
                raise ValueError(f"Recipe.{key} must be a positive integer, got {value!r}")
        for key in ("num_workers", "crop_padding", "seed"):
            value = getattr(self, key)
            if not _is_int(value) or value < 0:
                raise ValueError(f"Recipe.{key} must be an integer >= 0, got {value!r}")
        if self.crop_padding > 16:
            raise ValueError(f"Recipe.crop_padding={self.crop_padding} pixels is more than half a 32x32 image: use 0-16 (4 is classic)")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {self.optimizer!r}: use one of {', '.join(OPTIMIZERS)}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.schedule!r}: use one of {', '.join(SCHEDULES)}")
        for key, low, high in (("lr", 0.0, None), ("momentum", 0.0, 1.0), ("weight_decay", 0.0, None),
                               ("warmup_frac", 0.0, 1.0), ("label_smoothing", 0.0, 1.0)):
            value = getattr(self, key)
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            ok = ok and value >= low and (high is None or value < high) and (key != "lr" or value > 0)
            if not ok:
                where = "> 0" if key == "lr" else (f"in [{low}, {high})" if high is not None else f">= {low}")
                raise ValueError(f"Recipe.{key} must be a number {where}, got {value!r}")
        amp_dtype(self.amp)
        if self.data not in DATA_MODES:
            raise ValueError(f"unknown data mode {self.data!r}: use 'preload' (dataset on the device, augmented "
                             f"there) or 'loader' (a DataLoader with torchvision transforms)")
        if self.data == "preload" and self.num_workers:
            raise ValueError("num_workers is a DataLoader setting: use data='loader' with it, or num_workers=0")
        if self.exclude_compile and not self.compile:
            raise ValueError("exclude_compile=True excludes torch.compile's warm-up from the clock: it needs compile=True")
        for key in ("channels_last", "cudnn_benchmark", "compile", "exclude_compile", "flip", "tta"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"Recipe.{key} must be True or False, got {getattr(self, key)!r}")
        super().__post_init__()  # the training fields the race shares with every run

    def replace(self, **changes: Any) -> "Recipe":
        """A copy with some fields changed (and checked again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def train_config(self, **changes: Any) -> TrainConfig:
        """The :class:`TrainConfig` part of the recipe (what the loop reads), with ``changes``."""
        shared = {f.name: getattr(self, f.name) for f in dataclasses.fields(TrainConfig)}
        return TrainConfig(**{**shared, **changes})

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Recipe":
        unknown = sorted(set(d) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"unknown Recipe field(s) {', '.join(unknown)}: see help(dlo.lessons.race.Recipe)")
        return cls(**d)


def reference_recipe() -> Recipe:
    """The course's reference for one GPU (H100/H200) and real CIFAR-10, built from the course's tools only:
    ResNet-9 at full width, batch 512, SGD with Nesterov momentum on a one-cycle schedule, label smoothing
    0.2, bf16 autocast, channels_last, the dataset preloaded on the GPU and augmented there (random crop with
    reflection padding + flip), flip TTA, cudnn.benchmark, torch.compile (its warm-up, with cuDNN's autotuning,
    timed apart), 18 epochs at most."""
    return Recipe(name="reference", model="resnet9", width=64, batch_size=512, epochs=18, optimizer="sgd_nesterov",
                  schedule="onecycle", lr=0.4, momentum=0.9, weight_decay=5e-4, warmup_frac=0.25,
                  label_smoothing=0.2, amp="bf16", channels_last=True, cudnn_benchmark=True, compile=True,
                  exclude_compile=True, data="preload", tta=True, eval_batch_size=2000)


def smoke_recipe() -> Recipe:
    """The reference's smoke version for a CPU and generated data (:data:`SMOKE_DATA`): the same recipe,
    narrow (width 4), batch 64, 6 epochs, in fp32 (bf16 autocast is emulated, hence slow, on most CPUs),
    channels-first (the CPU's convolutions prefer it here) and not compiled (compiling takes longer than
    this race)."""
    return reference_recipe().replace(name="reference (smoke)", width=4, batch_size=64, epochs=6, lr=0.2,
                                      amp=None, channels_last=False, cudnn_benchmark=False, compile=False,
                                      exclude_compile=False, eval_batch_size=500)


RECIPES: dict[str, Callable[[], Recipe]] = {"reference": reference_recipe, "smoke": smoke_recipe}


def time_to_target(times: Sequence[float], accuracies: Sequence[float], target: float) -> float | None:
    """The first time at which the accuracy reached ``target`` (``>=``), or None if it never did.

    ``times[i]`` is when ``accuracies[i]`` was known (clock time after the i-th evaluation). Not the time
    of the best accuracy, and not an interpolation between evaluations: the race is won when a
    measurement *shows* the target, and a curve may go down again afterwards.
    """
    target = check_target(target)
    if len(times) != len(accuracies):
        raise ValueError(f"times and accuracies must have the same length, got {len(times)} and {len(accuracies)}")
    for t, acc in zip(times, accuracies):
        if acc >= target:
            return float(t)
    return None


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
                   verbose: bool):

    require_data(data_dir, generated)
    kw = dict(generated=generated, n_train=n_train, n_test=n_test)
    train = data.cifar10("train", data_dir, train_transform, verbose=verbose, **kw)
    test = data.cifar10("test", data_dir, test_transform, verbose=False, **kw)
    if generated is None and train.is_generated and verbose:
        print("[dlo.lessons.race] no real CIFAR-10 found: racing on GENERATED data (generated=None allows it); "
              "its accuracies are not CIFAR-10 accuracies", flush=True)
    return train, test


def _normalise(images_uint8_nhwc: Any, device: torch.device, channels_last: bool) -> torch.Tensor:

    x = torch.as_tensor(images_uint8_nhwc).to(device, non_blocking=True)  # copy bytes, convert on the device
    x = x.permute(0, 3, 1, 2).float().div_(255)
    mean = torch.tensor(CIFAR10_MEAN, device=device).view(1, 3, 1, 1)
    std = torch.tensor(CIFAR10_STD, device=device).view(1, 3, 1, 1)
    x = (x - mean) / std
    return x.contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)


def load_race_data(recipe: Recipe, device: torch.device | str, *, data_dir=None, generated: bool | None = False,
                   n_train: int | None = None, n_test: int | None = None, verbose: bool = True) -> RaceData:
    """Open the data as the recipe asks. Called on the clock by :func:`run_race`.

    ``generated``: False = real CIFAR-10 required (else a one-line FileNotFoundError saying where to put
    it), True = generated data (``n_train`` / ``n_test`` images, default :data:`SMOKE_DATA`), None = real
    if found, else generated (said in the log). ``n_train`` / ``n_test`` can also take the first images of
    real CIFAR-10 (all of them by default).
    """

    device = torch.device(device)
    n_gen_train = n_train or SMOKE_DATA["n_train"]
    n_gen_test = n_test or SMOKE_DATA["n_test"]
    for key, value in (("n_train", n_train), ("n_test", n_test)):
        if value is not None and (not _is_int(value) or value < 10):
            raise ValueError(f"{key} must be an integer >= 10 (or None: the whole set), got {value!r}")
    if recipe.data == "preload":
        train, test = _open_datasets(data_dir, generated, n_gen_train, n_gen_test, None, None, verbose)
        n_tr = min(n_train or len(train), len(train))
        n_te = min(n_test or len(test), len(test))
        out = RaceData(train.source, train.is_generated, n_tr, n_te, "preload")
        out.train_x = _normalise(train.data[:n_tr], device, recipe.channels_last)
        out.train_y = torch.as_tensor(train.targets[:n_tr]).to(device)
        out.test_x = _normalise(test.data[:n_te], device, recipe.channels_last)
        out.test_y = torch.as_tensor(test.targets[:n_te]).to(device)
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
    train, test = _open_datasets(data_dir, generated, n_gen_train, n_gen_test, v2.Compose(steps),
                                 data.test_transform(), verbose)
    n_tr = min(n_train or len(train), len(train))
    n_te = min(n_test or len(test), len(test))
    if n_tr < recipe.batch_size:
        raise ValueError(f"batch_size={recipe.batch_size} is more than the {n_tr} training images: use a smaller batch")
    out = RaceData(train.source, train.is_generated, n_tr, n_te, "loader")
    workers = recipe.num_workers
    out.train_loader = data.make_loader(
        Subset(train, range(n_tr)) if n_tr < len(train) else train, recipe.batch_size, shuffle=True,
        num_workers=workers, pin_memory=device.type == "cuda", drop_last=True, seed=recipe.seed,
        persistent_workers=workers > 0)
    out.test_loader = data.make_loader(
        Subset(test, range(n_te)) if n_te < len(test) else test, recipe.eval_batch_size, shuffle=False,
        num_workers=workers, pin_memory=device.type == "cuda", persistent_workers=workers > 0)
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


# --------------------------------------------------------------------------------------------------
# The race
# --------------------------------------------------------------------------------------------------

def _build(recipe: Recipe, device: torch.device) -> nn.Module:
    torch.manual_seed(recipe.seed)
    model = MODELS[recipe.model](num_classes=10, width=recipe.width)
    # device, channels_last, cudnn.benchmark (and the one-line refusal of GPU-only options on a CPU)
    model = prepare_model(model, device, channels_last=recipe.channels_last, cudnn_benchmark=recipe.cudnn_benchmark,
                          compile=False, compile_mode=recipe.compile_mode)
    if recipe.compile:
        model = compile_model(model, recipe)
    return model


def compile_model(model: nn.Module, recipe: Recipe) -> nn.Module:
    """``torch.compile`` as the recipe asks (a separate function, so that the tests can time a fake one)."""
    return torch.compile(model, mode=recipe.compile_mode, backend=recipe.compile_backend)


def _warm_up(model: nn.Module, recipe: Recipe, device: torch.device, dtype, n_test: int) -> None:
    """Run the compiled model on random data for every shape the race will use (training batch, evaluation
    batch and the last, smaller, evaluation batch) with a throwaway optimizer, then put the weights back."""
    saved_model = copy.deepcopy(model.state_dict())
    optimizer = make_optimizer(recipe.optimizer, model, lr=recipe.lr, weight_decay=recipe.weight_decay,
                               momentum=recipe.momentum)
    step = make_train_step(model, optimizer, nn.CrossEntropyLoss(label_smoothing=recipe.label_smoothing), device,
                           dtype, make_grad_scaler(device, dtype))
    gen = torch.Generator(device="cpu").manual_seed(12345)
    fmt = torch.channels_last if recipe.channels_last else torch.contiguous_format

    def batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(n, 3, 32, 32, generator=gen).to(device).contiguous(memory_format=fmt)
        return x, torch.randint(0, 10, (n,), generator=gen).to(device)

    for _ in range(2):
        step(*batch(recipe.batch_size))
    sizes = {min(recipe.eval_batch_size, n_test)}
    if n_test % recipe.eval_batch_size and n_test > recipe.eval_batch_size:
        sizes.add(n_test % recipe.eval_batch_size)
    for n in sorted(sizes):
        for _ in range(2):
            evaluate(model, [batch(n)], device, dtype, recipe.channels_last, tta=recipe.tta)
    model.load_state_dict(saved_model)
    synchronize(device)


def _count_test(data_dir, generated, n_test) -> int:
    """The number of test images the race will evaluate on (needed before the clock for the warm-up shapes)."""
    if n_test is not None:
        return n_test
    if generated is None:
        generated = find_cifar10(data_dir) is None
    return SMOKE_DATA["n_test"] if generated else 10000


class _StopAfter(Callback):
    """The race's last epoch when the target is not reached (``max_epochs`` may be less than the schedule)."""

    def __init__(self, max_epochs: int) -> None:
        self.max_epochs = max_epochs

    def on_epoch_end(self, state, record: dict) -> bool:
        return record["epoch"] + 1 >= self.max_epochs


def run_race(recipe: Recipe, target: float, *, data_dir=None, generated: bool | None = False,
             device: torch.device | str | None = None, max_epochs: int | None = None,
             time_budget_s: float | None = None, n_train: int | None = None, n_test: int | None = None,
             leaderboard: str | os.PathLike | None = None, progress: bool = True,
             verbose: bool = True) -> dict[str, Any]:
    """One attempt: train with ``recipe`` (the package's one loop, :func:`dlo.training.loop.train`), evaluate
    after every epoch, stop at ``target`` test accuracy (:class:`dlo.training.callbacks.StopAtTarget`).
    ``max_epochs`` (default ``recipe.epochs``, at most that: the schedule ends there) and ``time_budget_s``
    (stop after the epoch that exceeds it) bound a run that never reaches the target. ``generated``,
    ``data_dir``, ``n_train``, ``n_test``: see :func:`load_race_data`. ``leaderboard``: a JSON file the
    attempt is appended to (checked writable *before* the race).

    Returns a JSON-able record: ``time_to_target_s`` (None if not reached), ``epochs_to_target``,
    ``curve`` (one point per epoch: ``time_s`` on the race clock, test ``accuracy`` and ``loss``, mean
    ``train_loss``), ``load_s``, ``train_s``, ``eval_s``, ``compile_s`` (the excluded warm-up, or None),
    ``time_to_target_with_compile_s``, the recipe, the data's ``source`` and the environment.
    """
    if not isinstance(recipe, Recipe):
        raise TypeError(f"recipe must be a dlo.lessons.race.Recipe, got {type(recipe).__name__}")
    target = check_target(target)
    if max_epochs is None:
        max_epochs = recipe.epochs
    if not _is_int(max_epochs) or not 1 <= max_epochs <= recipe.epochs:
        raise ValueError(f"max_epochs must be an integer in [1, recipe.epochs={recipe.epochs}] (the schedule ends "
                         f"after recipe.epochs), got {max_epochs!r}")
    if time_budget_s is not None and not (isinstance(time_budget_s, (int, float)) and time_budget_s > 0):
        raise ValueError(f"time_budget_s must be a number of seconds > 0 (or None), got {time_budget_s!r}")
    board = check_writable(leaderboard) if leaderboard is not None else None
    require_data(data_dir, generated)  # before the compile warm-up: a missing data set is an error now
    device = pick_device(device)
    dtype = amp_dtype(recipe.amp)
    torch.zeros(1, device=device)  # device start-up (CUDA context): before the clock
    synchronize(device)

    compile_s = None
    model = None
    if recipe.exclude_compile:  # compile + warm up off the clock, timed on its own
        t_c = time.perf_counter()
        model = _build(recipe, device)
        _warm_up(model, recipe, device, dtype, _count_test(data_dir, generated, n_test))
        compile_s = time.perf_counter() - t_c

    # ---- the clock starts ----
    synchronize(device)
    t0 = time.perf_counter()
    d = load_race_data(recipe, device, data_dir=data_dir, generated=generated, n_train=n_train, n_test=n_test,
                       verbose=verbose)
    if model is None:
        model = _build(recipe, device)
    steps_per_epoch = (len(d.train_loader) if d.mode == "loader" else d.n_train // recipe.batch_size)
    if recipe.schedule == "onecycle" and recipe.epochs * steps_per_epoch < 3:
        raise ValueError(f"the onecycle schedule needs at least 3 optimizer steps, this recipe makes "
                         f"{recipe.epochs * steps_per_epoch}: more epochs, a smaller batch, or another schedule")

    def make_loader(generator: torch.Generator):
        if d.mode == "loader":
            return d.train_loader
        return Batches(lambda: _train_batches(d, recipe, generator), steps_per_epoch)

    test_batches = Batches(lambda: _test_batches(d, recipe), -(-d.n_test // recipe.eval_batch_size))
    stop = StopAtTarget(target, start=t0, time_budget_s=time_budget_s)
    synchronize(device)
    load_s = time.perf_counter() - t0
    # compile=False: the model is compiled already (above, as the recipe asks); one loss read per epoch
    cfg = recipe.train_config(compile=False, progress=progress, log_every=recipe.epochs * steps_per_epoch + 1,
                              eval_every_epoch=True, ckpt_path=None, resume=False, tracking_dir=None)
    result = train(model, make_loader, cfg, device, val_loader=test_batches, callbacks=[stop, _StopAfter(max_epochs)])
    epochs = [r for r in result.records if r["event"] == "epoch"]
    curve = [{"epoch": r["epoch"] + 1, "time_s": r["time_s"], "accuracy": r["val_accuracy"], "loss": r["val_loss"],
              "train_loss": r.get("train_loss", float("nan"))} for r in epochs]
    train_s = sum(r["seconds"] for r in epochs)
    eval_s = sum(r["eval_seconds"] for r in epochs)
    reached_at = stop.reached["time_s"] if stop.reached is not None else None
    epochs_to_target = stop.reached["epoch"] + 1 if stop.reached is not None else None
    stopped_by = stop.stopped_by or "max_epochs"
    record: dict[str, Any] = {
        "name": recipe.name, "target": target, "reached": reached_at is not None,
        "time_to_target_s": reached_at, "epochs_to_target": epochs_to_target, "epochs_run": len(curve),
        "stopped_by": stopped_by, "best_accuracy": max(p["accuracy"] for p in curve),
        "final_accuracy": curve[-1]["accuracy"], "total_s": curve[-1]["time_s"],
        "load_s": load_s, "train_s": train_s, "eval_s": eval_s,
        "compile_excluded": recipe.exclude_compile, "compile_s": compile_s,
        "time_to_target_with_compile_s": (reached_at + compile_s) if (reached_at is not None and compile_s is not None)
        else reached_at,
        "data": "generated" if d.is_generated else "real CIFAR-10", "source": d.source,
        "n_train": d.n_train, "n_test": d.n_test, "steps_per_epoch": steps_per_epoch,
        "device": str(device), "recipe": recipe.to_dict(), "curve": curve, "rules": TIMING_RULES,
        "env": environment_info(device),
    }
    if verbose:
        print(summary_line(record), flush=True)
    if board is not None:
        append_to_leaderboard(record, board)
    return record


def summary_line(record: dict[str, Any]) -> str:
    """One line saying how an attempt went."""
    where = f"{record['data']}, {record['device']}"
    if record["reached"]:
        line = (f"{record['name']}: {record['target']:.1%} reached in {record['time_to_target_s']:.2f} s "
                f"({record['epochs_to_target']} epochs; {where})")
    else:
        line = (f"{record['name']}: {record['target']:.1%} NOT reached in {record['epochs_run']} epochs, "
                f"{record['total_s']:.2f} s (best {record['best_accuracy']:.1%}, stopped by {record['stopped_by']}; {where})")
    if record.get("compile_s") is not None:
        line += f"; compile warm-up {record['compile_s']:.1f} s excluded"
    return line


# --------------------------------------------------------------------------------------------------
# Command line: python -m dlo race
# --------------------------------------------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dlo race",
                                description="One attempt at the CIFAR-10 race: time to a target test accuracy.")
    p.add_argument("--recipe", default="reference", choices=sorted(RECIPES), help="a named recipe (default: reference)")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="change a recipe field, e.g. --set epochs=16 --set amp=none (repeatable)")
    p.add_argument("--target", type=float, default=None,
                   help=f"test accuracy to reach, in (0, 1] (default: {REAL_TARGET} on CIFAR-10, {SMOKE_TARGET} with --generated)")
    p.add_argument("--data-dir", default=None, help="folder holding cifar-10-batches-py (or set DLO_DATA_DIR)")
    p.add_argument("--generated", action="store_true",
                   help="race on generated data (the smoke race; NOT CIFAR-10, use a target such as "
                        f"{SMOKE_TARGET})")
    p.add_argument("--n-train", type=int, default=None, help="training images (default: all, or the smoke size)")
    p.add_argument("--n-test", type=int, default=None, help="test images (default: all, or the smoke size)")
    p.add_argument("--device", default=None, help="auto (default), cpu or cuda")
    p.add_argument("--max-epochs", type=int, default=None)
    p.add_argument("--time-budget", type=float, default=None, help="stop after the epoch that passes this many seconds")
    p.add_argument("--repeats", type=int, default=1, help="attempts with seeds seed, seed+1, ...")
    p.add_argument("--out", default=None, help="write the records (with environment) to this JSON file")
    p.add_argument("--leaderboard", default=None, help="append the attempts to this JSON leaderboard")
    p.add_argument("--no-progress", action="store_true")
    return p


def _parse_value(text: str) -> Any:
    low = text.strip().lower()
    if low in ("none", "null"):
        return None
    if low in ("true", "false"):
        return low == "true"
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def recipe_with(name: str, settings: Iterable[str]) -> Recipe:
    """A named recipe with ``FIELD=VALUE`` changes (the command line's ``--set``)."""
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}: use one of {', '.join(RECIPES)}")
    changes: dict[str, Any] = {}
    for item in settings:
        if "=" not in item:
            raise ValueError(f"--set expects FIELD=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        changes[key.strip()] = _parse_value(value)
    if changes.get("amp") == "none":
        changes["amp"] = None
    return Recipe.from_dict({**RECIPES[name]().to_dict(), **changes})


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        recipe = recipe_with(args.recipe, args.set)
        if args.repeats < 1:
            raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
        if args.target is None:
            args.target = SMOKE_TARGET if args.generated else REAL_TARGET
        records = []
        for k in range(args.repeats):
            r = recipe.replace(seed=recipe.seed + k) if k else recipe
            records.append(run_race(r, args.target, data_dir=args.data_dir, generated=True if args.generated else False,
                                    device=args.device, max_epochs=args.max_epochs, time_budget_s=args.time_budget,
                                    n_train=args.n_train, n_test=args.n_test, leaderboard=args.leaderboard,
                                    progress=not args.no_progress))
    except (ValueError, TypeError, FileNotFoundError, PermissionError, IsADirectoryError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.out:
        times = [r["time_to_target_s"] for r in records if r["reached"]]
        save_json({"target": args.target, "recipe": recipe.to_dict(), "attempts": len(records),
                   "reached": len(times), "median_time_to_target_s": statistics.median(times) if times else None,
                   "env": records[0]["env"], "records": records}, args.out)
        print(f"wrote {args.out}")
    return 0 if all(r["reached"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
