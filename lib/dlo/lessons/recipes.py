"""The training runs of the recipes notebook (Jour3/recipes.ipynb), out of the student's way.

:class:`RecipeRuns` trains a fresh ResNet-18 per recipe (same initial weights, same data order) with some
``dlo.training`` switches on, tracks it (TensorBoard and MLflow, or JSON records) and keeps one row per run:
its steps (counted), ``epochs_s`` (the sum of its epochs' training time, evaluation excluded; the tracking store's
``time/train_s`` is another quantity: the whole run's wall time, evaluation included) and its final validation
accuracy and loss.
"""
from __future__ import annotations

from typing import Any

import torch

from dlo import data
from dlo.models import resnet18_cifar
from dlo.training import TrainConfig, train


class RecipeRuns:
    """The runs of one execution: ``runs`` (one row each, in order) and ``models`` (the model each one evaluates:
    its EMA when it kept one)."""

    def __init__(self, settings: dict[str, Any], train_set: Any, val_loader: Any, device: torch.device, *,
                 workers: int, tracking_dir: str, session: str, generated: bool) -> None:
        self.S, self.train_set, self.val_loader, self.device = settings, train_set, val_loader, device
        self.workers, self.tracking_dir, self.session, self.generated = workers, str(tracking_dir), session, generated
        self.cuda = device.type == "cuda"
        self.runs: list[dict[str, Any]] = []
        self.models: dict[str, torch.nn.Module] = {}

    def make_loader(self, generator: torch.Generator, batch_size: int | None = None):
        """The training loader (``batch_size=None``: the baseline batch; ``dlo.training`` passes one when a
        ``batch_schedule`` is set)."""
        return data.make_loader(self.train_set, batch_size or self.S["batch"], shuffle=True, num_workers=self.workers,
                                drop_last=True, generator=generator, pin_memory=self.cuda, persistent_workers=False)

    def run(self, name: str, batch_transform: Any = None, **switches: Any):
        """Train a fresh ResNet-18 with ``switches`` (``TrainConfig`` fields) on; keep its row and model."""
        S = self.S
        cfg = TrainConfig(epochs=S["epochs"], lr=switches.pop("lr", S["lr"]), amp="bf16" if self.cuda else None,
                          channels_last=self.cuda, log_every=2, seed=0, tracking_dir=self.tracking_dir, run_name=name,
                          **switches)
        torch.manual_seed(0)
        model = resnet18_cifar(width=S["width"])
        res = train(model, self.make_loader, cfg, self.device, val_loader=self.val_loader,
                    batch_transform=batch_transform,
                    track_params={"session": self.session, "recipe": name, "width": S["width"],
                                  "generated_data": self.generated})
        epochs = [r for r in res.records if r["event"] == "epoch"]
        row = {"recipe": name, "epochs_s": sum(r["seconds"] for r in epochs), "steps": res.step,
               "val_accuracy": epochs[-1]["val_accuracy"], "val_loss": epochs[-1]["val_loss"], "tta": cfg.tta,
               "curve": [r["val_accuracy"] for r in epochs]}
        self.runs.append(row)
        self.models[name] = res.ema_model.module if res.ema_model is not None else res.model
        print(f"{name}: validation accuracy {row['val_accuracy']:.3f} after {res.step} steps, "
              f"{row['epochs_s']:.1f} s of training")
        return res
