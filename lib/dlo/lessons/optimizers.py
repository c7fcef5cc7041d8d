"""The training runs and the accumulation measurement of the optimizers notebook (Jour3/optimizers.ipynb).

:class:`OptimizerRuns` trains a fresh ResNet-18 per run (same initial weights) with ``dlo.training.train`` and
keeps one row per run (validation accuracies, steps, the first learning rate used, training time), the curves, and
the weights of the run with the best validation accuracy for the final test; :meth:`OptimizerRuns.show` draws the
curves of named runs. :func:`accumulation` counts and measures what gradient accumulation changes.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import matplotlib.pyplot as plt
import pandas as pd
import torch
from torch import nn

from dlo import data
from dlo.lessons import claims
from dlo.measure import bench
from dlo.measure.decide import pair_decider
from dlo.models import resnet18_cifar
from dlo.training import TrainConfig, make_train_step, train


class OptimizerRuns:
    """The runs of one execution: ``runs`` (rows), ``curves`` (loss and accuracy points), ``kept`` (the best run's
    row, config and weights)."""

    def __init__(self, settings: dict[str, Any], train_set: Any, val_loader: Any, device: torch.device, *,
                 workers: int, out: Path) -> None:
        self.S, self.train_set, self.val_loader, self.device = settings, train_set, val_loader, device
        self.workers, self.out, self.cuda = workers, Path(out), device.type == "cuda"
        self.runs: list[dict[str, Any]] = []
        self.curves: list[dict[str, Any]] = []
        self.kept: dict[str, Any] = {}

    def run(self, name: str, *, optimizer: str = "sgd_nesterov", schedule: str = "onecycle", lr: float = 0.1,
            weight_decay: float = 5e-4, batch: int | None = None, warmup_steps: int = 0, epochs: int | None = None,
            **extra: Any):
        """Train a fresh ResNet-18 (same initial weights every time) and record what happened."""
        S, cuda = self.S, self.cuda
        batch = batch or S["batch"]
        cfg = TrainConfig(epochs=epochs or S["epochs"], lr=lr, weight_decay=weight_decay, optimizer=optimizer,
                          schedule=schedule, warmup_steps=warmup_steps, amp="bf16" if cuda else None,
                          channels_last=cuda, log_every=1, seed=0, **extra)
        torch.manual_seed(0)
        model = resnet18_cifar(width=S["width"])

        def make_loader(generator):
            return data.make_loader(self.train_set, batch, shuffle=True, num_workers=self.workers, drop_last=True,
                                    generator=generator, pin_memory=cuda)

        res = train(model, make_loader, cfg, self.device, val_loader=self.val_loader)
        row = self._record(name, res, optimizer, schedule, lr, weight_decay, batch, warmup_steps,
                           len(make_loader(torch.Generator())))
        if not self.kept or row["kept_val_accuracy"] > self.kept["row"]["kept_val_accuracy"]:
            self.kept.update(row=row, config=cfg,
                             state={k: v.detach().cpu().clone() for k, v in res.model.state_dict().items()})
        print(f"{name}: val accuracy {row['final_val_accuracy']:.3f} (best {row['best_val_accuracy']:.3f}), "
              f"final loss {row['final_loss']:.3f}, {row['train_s']:.1f} s")
        return res

    def _record(self, name, res, optimizer, schedule, lr, weight_decay, batch, warmup_steps, steps_per_epoch):
        ep = [r for r in res.records if r["event"] == "epoch"]
        for r in res.records:
            if r["event"] == "train":
                self.curves.append({"run": name, "epoch": r["step"] / steps_per_epoch, "loss": r["loss"], "lr": r["lr"]})
            elif r["event"] == "epoch":
                self.curves.append({"run": name, "epoch": r["epoch"] + 1, "val_accuracy": r["val_accuracy"]})
        restored = [r for r in res.records if r["event"] == "restored_best"]  # early stopping keeps its best epoch
        row = {"run": name, "optimizer": optimizer, "schedule": schedule, "lr": lr, "weight_decay": weight_decay,
               "batch": batch, "steps": res.step, "train_s": sum(r["seconds"] for r in ep),
               "warmup_steps": warmup_steps, "first_lr": next(r["lr"] for r in res.records if r["event"] == "train"),
               "final_loss": next(r["loss"] for r in reversed(res.records) if r["event"] == "train"),
               "final_val_accuracy": ep[-1]["val_accuracy"], "best_val_accuracy": max(r["val_accuracy"] for r in ep),
               "kept_val_accuracy": restored[-1]["val_accuracy"] if restored else ep[-1]["val_accuracy"]}
        self.runs.append(row)
        return row

    def show(self, names: Sequence[str], title: str) -> plt.Figure:
        """Loss and validation-accuracy curves of the named runs (those that ran), side by side."""
        curves = pd.DataFrame(self.curves)
        fig, ax = plt.subplots(1, 2, figsize=(12, 3.4))
        for name in names:
            c = curves[curves["run"] == name]
            loss = c.dropna(subset=["loss"])
            ax[0].plot(loss["epoch"], loss["loss"].rolling(5, min_periods=1).mean(), label=name)
            acc = c.dropna(subset=["val_accuracy"])
            ax[1].plot(acc["epoch"], acc["val_accuracy"], marker="o", label=name)
        ax[0].set(title="training loss (moving average of 5 steps)", xlabel="epoch")
        ax[1].set(title="validation accuracy (held out of the training set)", xlabel="epoch")
        ax[1].legend(fontsize=8)
        fig.suptitle(title)
        fig.tight_layout()
        slug = "".join(ch if ch.isalnum() else "_" for ch in title.lower()).strip("_")
        fig.savefig(self.out / f"curves_{slug}.png", dpi=110)
        return fig


def accumulation(train_set: Any, settings: dict[str, Any], device: torch.device, *,
                 repeats: int = 8) -> dict[str, Any]:
    """One step of the ResNet at the large batch, whole (``accum_steps=1``) and cut into 4 micro-batches: the bytes
    autograd keeps for one forward (counted), the peak memory of the step (measured twice per setting, in turns:
    the spread of the two readings is the peak's noise), then both steps timed interleaved until the decision rule
    can tell (or 4x ``repeats`` rounds). Returns ``{"rows", "sentence", "times"}``: the rows and the memory sentence
    (:func:`dlo.lessons.claims.accumulation_sentence`), and the two timings for ``conclude``."""
    S = settings
    torch.manual_seed(0)
    model = resnet18_cifar(width=S["width"]).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    xb, yb = data.preload_batches(train_set, 1, batch_size=min(S["large_batch"], S["n_train"]), device=device)[0]
    criterion = nn.CrossEntropyLoss()
    steps = {k: make_train_step(model, opt, criterion, device, accum_steps=k) for k in (4, 1)}
    rows = {k: {"accum_steps": k, "batch": len(xb), "median_step_s": [], "peak_MiB": []} for k in (4, 1)}
    for k in (4, 1, 4, 1):
        m = bench.measure(f"accum_steps={k}", lambda: steps[k](xb, yb), items_per_call=len(xb), warmup=1, repeats=3,
                          device=device, progress=False)
        rows[k]["median_step_s"].append(m.median_s)
        rows[k]["peak_MiB"].append(m.peak_memory_bytes / 2**20)
        rows[k]["memory_kind"] = m.memory_kind
    model.train()
    for k, row in rows.items():
        micro = len(xb) // k
        row["saved_MiB"] = claims.saved_bytes(lambda: criterion(model(xb[:micro].clone()), yb[:micro])) / 2**20
    names = ("accum_steps=4", "accum_steps=1")
    times = bench.measure_interleaved([bench.Candidate(f"accum_steps={k}", (lambda s=steps[k]: s(xb, yb)), len(xb),
                                                       device) for k in (4, 1)],
                                      repeats=repeats, max_repeats=4 * repeats, until=pair_decider(*names),
                                      track_memory=False, progress=False)
    model.zero_grad(set_to_none=True)
    rows = list(rows.values())
    return {"rows": rows, "sentence": claims.accumulation_sentence(rows), "times": times}
