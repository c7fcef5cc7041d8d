"""The race's recipes: :class:`Recipe` (a training configuration plus the race's own fields), the reference
and smoke recipes, the targets and the rules of the clock.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass
from typing import Any, Callable

from torch import nn

from dlo.runtime.validate import is_int
from dlo.training.optim import OPTIMIZERS, SCHEDULES
from dlo.models.resnets import resnet9, resnet18_cifar
from dlo.training.step import amp_dtype
from dlo.training.config import TrainConfig



REAL_TARGET = 0.94  # the classic race: 94 % test accuracy on real CIFAR-10

# The smoke race: generated data (NOT CIFAR-10), a tiny network on a CPU. Its target is a level the smoke
# recipe reaches in well under a minute on two CPU cores; it says nothing about CIFAR-10.
SMOKE_TARGET = 0.50

SMOKE_DATA = {"n_train": 2048, "n_test": 500}  # generated images (train / test) of the smoke race

DATA_MODES = ("preload", "loader")

#: The race's rule, stored in every record (an attempt made under another rule is not ranked with these).
RACE_RULE = "fixed epochs, one test evaluation"

TIMING_RULES = ("the recipe's epochs are all trained (nothing looks at the test set during training); the test set "
                "is evaluated once, after the last epoch; the clock starts before the dataset is read; data loading "
                "(and preloading to the device), model building, training and that one evaluation are counted; "
                "torch.compile's first calls are counted unless the recipe sets exclude_compile (then timed apart "
                "as compile_s); device start-up (CUDA context) is not counted; every clock reading follows a "
                "synchronize")

# --------------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------------

MODELS: dict[str, Callable[..., nn.Module]] = {"resnet9": resnet9, "resnet18": resnet18_cifar}

# --------------------------------------------------------------------------------------------------
# The recipe
# --------------------------------------------------------------------------------------------------


@dataclass
class Recipe(TrainConfig):
    """Everything an attempt at the race chooses: a :class:`dlo.training.config.TrainConfig` (optimizer,
    schedule, ``lr``, ``warmup_frac``, ``amp``, ``channels_last``, ``compile``, ``tta``, ``seed`` ... each
    documented there, all usable here: EMA, progressive resizing, label smoothing) plus the race's own fields
    below. Invalid values raise a one-line ``ValueError``.

    ``epochs`` is the schedule's length (the learning rate reaches its end value after ``epochs`` epochs), and
    the race trains all of them before it looks at the test set (:data:`RACE_RULE`): choose it on a validation
    split (:func:`dlo.lessons.race.validation_run`), never on the test set. ``tta`` is the one test-time augmentation of the package
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
            if not is_int(value) or value < 1:
                raise ValueError(f"Recipe.{key} must be a positive integer, got {value!r}")
        for key in ("num_workers", "crop_padding", "seed"):
            value = getattr(self, key)
            if not is_int(value) or value < 0:
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
    timed apart), 18 epochs."""
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
