"""The data and training plumbing of the transfer-learning notebook (Jour3/transfer.ipynb).

- :class:`Relabelled`: the images of some classes (at most ``per_class`` of each), labelled 0, 1, ...;
- :func:`task`: a task's training, validation (held out of the training split) and test sets;
- :class:`Strategies`: one strategy's run on task B (its optimizer, the package's training loop with frozen
  BatchNorm statistics kept frozen), recording per-epoch curves, epoch records and the model; :meth:`final` is the
  table of the strategies' last epochs.
"""
from __future__ import annotations

from typing import Any, Sequence

import pandas as pd
import torch
from torch.utils.data import Dataset

from dlo import data
from dlo.training import FreezeNormStats, TrainConfig, optim, train


class Relabelled(Dataset):
    """The images of ``classes`` (at most ``per_class`` of each), labelled 0 .. len(classes) - 1."""

    def __init__(self, dataset: Any, classes: Sequence[int], per_class: int | None = None) -> None:
        self.dataset, self.classes = dataset, tuple(classes)
        counts = {c: 0 for c in self.classes}
        self.indices = []
        for i, y in enumerate(dataset.targets):
            if y in counts and (per_class is None or counts[y] < per_class):
                counts[y] += 1
                self.indices.append(i)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int):
        image, label = self.dataset[self.indices[i]]
        return image, self.classes.index(label)


def task(settings: dict[str, Any], data_dir: str | None, classes: Sequence[int], seed: int,
         per_class: int | None = None) -> tuple[Relabelled, Relabelled, Relabelled, str]:
    """Training, validation (held out of the training split) and test sets of ``classes``, and the data's source."""
    S = settings
    sizes = dict(n_train=S["n_train"] + S["n_val"], n_test=S["n_test"], seed=seed)
    train_set, val_set = data.cifar10_train_val(S["n_val"], data_dir, data.train_transform(), data.test_transform(),
                                                **sizes)
    test_set = data.cifar10("test", data_dir, data.test_transform(), verbose=False, **sizes)
    return (Relabelled(train_set, classes, per_class), Relabelled(val_set, classes), Relabelled(test_set, classes),
            train_set.source)


class Strategies:
    """Task B's runs, one per strategy: ``curves`` (one row per epoch), ``epochs`` (the loop's epoch records) and
    ``models``, by strategy."""

    def __init__(self, settings: dict[str, Any], train_set: Any, val_loader: Any, device: torch.device,
                 make_loader: Any) -> None:
        self.S, self.train_set, self.val_loader, self.device = settings, train_set, val_loader, device
        self.make_loader, self.cuda = make_loader, device.type == "cuda"
        self.curves: list[dict[str, Any]] = []
        self.epochs: dict[str, list[dict[str, Any]]] = {}
        self.models: dict[str, torch.nn.Module] = {}

    def fit(self, name: str, model: torch.nn.Module, param_groups: Any, lr: float) -> list[dict[str, Any]]:
        """SGD with Nesterov momentum and one-cycle on ``param_groups``, run by ``dlo.training.train``;
        ``FreezeNormStats`` keeps the running statistics of frozen BatchNorm layers frozen."""
        S = self.S
        opt = optim.make_optimizer("sgd_nesterov", param_groups, lr=lr, weight_decay=5e-4)
        trainable = sum(p.numel() for g in opt.param_groups for p in g["params"])
        # the same shuffles for every strategy: one loader per strategy, seeded alike, reused every epoch
        loader = self.make_loader(self.train_set, S["batch_b"], shuffle=True,
                                  generator=torch.Generator().manual_seed(0), persistent=True)
        cfg = TrainConfig(epochs=S["epochs_b"], lr=lr, schedule="onecycle", amp="bf16" if self.cuda else None,
                          channels_last=self.cuda, log_every=10**9, progress=False)
        out = train(model, lambda generator: loader, cfg, self.device, val_loader=self.val_loader, optimizer=opt,
                    callbacks=[FreezeNormStats()])
        self.models[name] = model
        self.epochs[name] = [r for r in out.records if r["event"] == "epoch"]
        rows, elapsed = [], 0.0
        for r in self.epochs[name]:
            elapsed += r["seconds"]
            rows.append({"strategy": name, "epoch": r["epoch"] + 1, "train_s": elapsed,
                         "val_accuracy": r["val_accuracy"], "trainable_params": trainable})
        self.curves += rows
        print(f"{name}: validation accuracy {rows[-1]['val_accuracy']:.1%} after {elapsed:.1f} s of training")
        return rows

    def final(self) -> pd.DataFrame:
        """One row per strategy: trainable parameters, training time, final and best validation accuracy."""
        curves = pd.DataFrame(self.curves)
        final = curves.groupby("strategy", sort=False).agg(
            trainable_params=("trainable_params", "first"), train_s=("train_s", "last"),
            final_val_accuracy=("val_accuracy", "last"), best_val_accuracy=("val_accuracy", "max"))
        final["s_per_epoch"] = final["train_s"] / self.S["epochs_b"]
        return final
