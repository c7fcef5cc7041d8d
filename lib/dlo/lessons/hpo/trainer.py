"""The small CIFAR trainer that Optuna and Ray Tune trials run.
"""
from __future__ import annotations

import os
from typing import Any, Mapping

import torch
from torch.utils.data import Subset

from dlo.models.small import TinyMLP
from dlo.data.loaders import Batches
from dlo.training.config import TrainConfig
from dlo.training.loop import train
from dlo import data
from dlo.models.resnets import resnet18_cifar


# --------------------------------------------------------------------------------------------------
# A small CIFAR-10 training, one epoch per call
# --------------------------------------------------------------------------------------------------


TRIAL_KEYS = ("x_train", "y_train", "x_val", "y_val")
"""What a trial's data holds: training and validation tensors, both from CIFAR-10's training split."""


def _generated_sizes(n_train: int, n_val: int, n_test: int = 2000) -> dict[str, int]:
    """The generated data set the trials and the final report share (the one other lessons use, or larger)."""
    return dict(n_train=max(n_train + n_val, 10000), n_test=max(n_test, 2000))


def _check_count(name: str, n: Any) -> int:
    if not isinstance(n, int) or isinstance(n, bool) or n < 10:
        raise ValueError(f"{name} must be an integer >= 10, got {n!r}")
    return n


def _tensors(dataset, indices) -> tuple[torch.Tensor, torch.Tensor]:
    (x, y), = data.preload_batches(Subset(dataset, list(indices)), 1, batch_size=len(indices))
    return x, y


def load_cifar_tensors(n_train: int, n_val: int, data_dir: str | os.PathLike | None = None,
                       verbose: bool = True, *, seed: int = data.SPLIT_SEED) -> dict[str, torch.Tensor]:
    """``n_train`` training and ``n_val`` validation images of CIFAR-10 (or of the generated stand-in, see
    :func:`dlo.data.cifar.cifar10`) as normalised tensors in memory: ``x_train, y_train, x_val, y_val``.

    Both come from the **training split**: the validation images are held out of it by
    :func:`dlo.data.splits.split_indices` (seeded, disjoint from the training images). The test split is not
    read here: every trial is scored on the validation images, and the configuration the search chooses is
    reported once on the test split (:func:`load_cifar_test_tensors`, :meth:`Trainer.accuracy`).

    Held in memory, the data costs nothing per trial: a search runs many short trainings, and a loader
    started for each one would dominate their time.
    """
    n_train, n_val = _check_count("n_train", n_train), _check_count("n_val", n_val)
    train = data.cifar10("train", data_dir, data.test_transform(), verbose=verbose, **_generated_sizes(n_train, n_val))
    train_idx, val_idx = data.split_indices(len(train), n_val, seed)
    if n_train > len(train_idx):
        raise ValueError(f"n_train={n_train} + n_val={n_val} is more than the {len(train)} images of the training "
                         f"split: ask for fewer")
    x_train, y_train = _tensors(train, train_idx[:n_train])
    x_val, y_val = _tensors(train, val_idx)
    return {"x_train": x_train, "y_train": y_train, "x_val": x_val, "y_val": y_val}


def load_cifar_test_tensors(n_test: int, data_dir: str | os.PathLike | None = None, *, n_train: int, n_val: int,
                            verbose: bool = False) -> dict[str, torch.Tensor]:
    """The first ``n_test`` images of the **test split** as ``x_test, y_test``: for the one final report of the
    configuration a search chose, never for a trial (``n_train`` / ``n_val``: those of
    :func:`load_cifar_tensors`, so that generated data comes from the same data set)."""
    n_test = _check_count("n_test", n_test)
    test = data.cifar10("test", data_dir, data.test_transform(), verbose=verbose,
                        **_generated_sizes(n_train, n_val, n_test))
    if n_test > len(test):
        raise ValueError(f"n_test={n_test} is more than the {len(test)} images of the test split: ask for fewer")
    x_test, y_test = _tensors(test, range(n_test))
    return {"x_test": x_test, "y_test": y_test}


HPARAMS = {"lr": None, "momentum": 0.9, "weight_decay": 0.0}  # None: required


class Trainer:
    """One trial's training: model, SGD optimiser and data; :meth:`train_epoch` runs one epoch and returns
    the validation accuracy (validation images held out of the training split, see :func:`load_cifar_tensors`;
    a ``data`` holding anything else, such as test tensors, is refused). :meth:`accuracy` scores other images:
    the test split, once, for the configuration the search chose.

    ``config`` holds the hyper-parameters ``lr`` (required), ``momentum`` (0.9) and ``weight_decay`` (0);
    any other name is an error, so a typo in a search space cannot go unnoticed. ``arch`` is ``"resnet"``
    (:func:`dlo.models.resnets.resnet18_cifar` of the given ``width``) or ``"mlp"`` (:class:`TinyMLP` with ``width``
    hidden units). :meth:`state_dict` / :meth:`load_state_dict` save and restore everything needed to
    continue (for checkpoints), and :meth:`set_hparams` changes the hyper-parameters in place (what
    Population Based Training does after copying a better trial).
    """

    def __init__(self, config: Mapping[str, Any], data: Mapping[str, torch.Tensor], *, arch: str = "resnet",
                 width: int = 4, batch_size: int = 64, device: str | torch.device = "cpu", seed: int = 0) -> None:
        missing = set(TRIAL_KEYS) - set(data)
        if missing:
            raise ValueError(f"data lacks {', '.join(sorted(missing))}: build it with dlo.lessons.hpo.trainer.load_cifar_tensors")
        extra = sorted(set(data) - set(TRIAL_KEYS))
        if extra:
            raise ValueError(f"data holds {', '.join(extra)}: a trial gets only {', '.join(TRIAL_KEYS)} (training split); "
                             f"keep the test split out of the search and report the chosen configuration with "
                             f"Trainer.accuracy(x_test, y_test) once it is trained")
        if arch not in ("resnet", "mlp"):
            raise ValueError(f"unknown arch {arch!r}: use 'resnet' or 'mlp'")
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        self.config = self._check_config(config)
        self.device = torch.device(device)
        self.batch_size = batch_size
        self.seed = seed
        self.epoch = 0
        torch.manual_seed(seed)
        if arch == "resnet":

            model = resnet18_cifar(width=width)
        else:
            model = TinyMLP(hidden=width)
        self.model = model.to(self.device)
        self.data = {k: data[k].to(self.device) for k in TRIAL_KEYS}
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=self.config["lr"],
                                         momentum=self.config["momentum"], weight_decay=self.config["weight_decay"])

    @staticmethod
    def _check_config(config: Mapping[str, Any]) -> dict[str, float]:
        if not isinstance(config, Mapping):
            raise ValueError(f"config must be a dict of hyper-parameters, got {type(config).__name__}")
        unknown = sorted(set(config) - set(HPARAMS))
        if unknown:
            raise ValueError(f"unknown hyper-parameter(s) {', '.join(map(repr, unknown))}: the Trainer uses "
                             f"{', '.join(HPARAMS)}")
        if "lr" not in config:
            raise ValueError("config needs 'lr', the learning rate")
        out = {k: float(config.get(k, default)) for k, default in HPARAMS.items()}
        if not (out["lr"] > 0 and out["weight_decay"] >= 0 and 0 <= out["momentum"] < 1):
            raise ValueError(f"need lr > 0, weight_decay >= 0 and 0 <= momentum < 1, got {out}")
        return out

    def set_hparams(self, config: Mapping[str, Any]) -> None:
        """New hyper-parameters for the next epochs, keeping the weights and the optimiser's momentum."""
        self.config = self._check_config({**self.config, **config})
        for group in self.optimizer.param_groups:
            group.update(lr=self.config["lr"], momentum=self.config["momentum"],
                         weight_decay=self.config["weight_decay"])

    def train_epoch(self) -> float:
        """One epoch over the training tensors (shuffled, seeded by ``seed`` and the epoch) with the package's one
        loop (:func:`dlo.training.loop.train`, this trial's optimizer kept across epochs), then the accuracy."""
        x, y = self.data["x_train"], self.data["y_train"]
        n_batches = -(-len(y) // self.batch_size)

        def epoch_batches():
            gen = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
            order = torch.randperm(len(y), generator=gen).to(self.device)
            for i in range(0, len(y), self.batch_size):
                idx = order[i:i + self.batch_size]
                yield x[idx], y[idx]

        cfg = TrainConfig(epochs=1, lr=self.config["lr"], momentum=self.config["momentum"],
                          weight_decay=self.config["weight_decay"], optimizer="sgd", schedule=None, seed=self.seed,
                          progress=False, log_every=n_batches + 1, eval_every_epoch=False)
        train(self.model, lambda _gen: Batches(epoch_batches, n_batches), cfg, self.device, optimizer=self.optimizer)
        self.epoch += 1
        return self.evaluate()

    def evaluate(self) -> float:
        """Accuracy on the validation tensors (eval mode; a diverged model scores what its argmax gives)."""
        return self.accuracy(self.data["x_val"], self.data["y_val"])

    @torch.inference_mode()
    def accuracy(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """Accuracy of the model as it is now on ``(x, y)`` (eval mode), e.g. the test split for the final report."""
        self.model.eval()
        x, y = x.to(self.device), y.to(self.device)
        correct = sum((self.model(x[i:i + 512]).argmax(1) == y[i:i + 512]).sum().item() for i in range(0, len(y), 512))
        return correct / len(y)

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), "epoch": self.epoch,
                "config": dict(self.config)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.epoch = int(state["epoch"])
        self.config = self._check_config(state["config"])
