"""Jour 2's augmentation notebook, the plumbing behind its cells: whether the CPU keeps up with RandAugment, the
loop-vs-batched MixUp/CutMix benchmark (chart and sentences), the label weights of torchvision's CutMix against
ours, and the short training runs with and without mixing. Every sentence that states a measured outcome is the
decision rule's (:func:`dlo.measure.conclude`), recorded in ``results``; every long loop shows progress."""
from __future__ import annotations

from typing import Any, Callable

import matplotlib.pyplot as plt
import pandas as pd
import torch
import torch.nn.functional as F
from torchvision.transforms import v2

from dlo import data
from dlo.data import augment as aug
from dlo.lessons import mixing
from dlo.lessons.loader import core_budget
from dlo.measure import Measurement, bench, conclude, decide
from dlo.models import resnet18_cifar
from dlo.training import TrainConfig, TrainMetric, autocast_context, soft_target_criterion, train
from dlo.measure.records import torch_threads


def randaugment_pipeline() -> v2.Compose:
    """CIFAR-10's training pipeline with RandAugment, as the loader workers would run it."""
    return v2.Compose([v2.RandomCrop(32, padding=4), v2.RandomHorizontalFlip(), v2.RandAugment(), v2.ToImage(),
                       v2.ToDtype(torch.float32, scale=True), v2.Normalize(data.CIFAR10_MEAN, data.CIFAR10_STD)])


def randaugment_supply(results: dict[str, Any], pil_image: Any, S: dict[str, Any], dev: torch.device) -> str:
    """Images/s that the loader workers can augment (one core each) against images/s the training step consumes,
    both measured; the sentence is the decision rule's on the two (supply "faster" = the CPU keeps up)."""
    with torch_threads(1):  # one worker = one core
        times = bench.time_calls(lambda: randaugment_pipeline()(pil_image), warmup=5, repeats=S["transform_repeats"],
                                 progress="RandAugment, one core")
    workers = max(core_budget()["max_workers_per_rank"], 1)
    # groups of 10 images: RandAugment draws its operations per image, the noise is the machine's over a group
    groups = [sum(times[i:i + 10]) for i in range(0, len(times) - 9, 10)]
    supply = Measurement(name=f"RandAugment in {workers} worker(s)", times_s=groups, items_per_call=10 * workers,
                         warmup=5)
    torch.manual_seed(0)
    model = resnet18_cifar(width=S["width"]).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    xb = torch.randn(S["batch_size"], 3, 32, 32, device=dev)
    yb = torch.randint(0, 10, (S["batch_size"],), device=dev)

    def step() -> None:
        with autocast_context(dev, torch.bfloat16 if dev.type == "cuda" else None):
            loss = F.cross_entropy(model(xb), yb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    need = bench.measure("training step", step, items_per_call=S["batch_size"], warmup=2, repeats=5, device=dev)
    per_core = 10 / (sorted(groups)[len(groups) // 2])
    results["randaugment"] = {"per_core_img_s": per_core, "workers": workers, "step_img_s": need.throughput,
                              "supply": supply.to_record(), "step": need.to_record()}
    said = conclude(results, supply, need, a_label=f"The augmentation supply of {workers} worker(s)",
                    b_label=f"what the training step consumes on {dev.type}")
    return (f"RandAugment: about **{per_core:,.0f} img/s per core** (median of groups of 10 images). {said} "
            f"(\"faster\" here means the CPU keeps up with the step.)")


def run_benchmark(results: dict[str, Any], S: dict[str, Any], dev: torch.device,
                  path: Any = None) -> tuple[pd.DataFrame, dict[tuple[str, str, str], dict[str, Any]]]:
    """Loop vs batched MixUp/CutMix on the CPU and, when there is one, the GPU (a progress bar per timing), the
    chart of images/s, and the records by (device, kind, implementation)."""
    devices = [torch.device("cpu")] + ([dev] if dev.type == "cuda" else [])
    records = []
    for d in devices:
        records += mixing.benchmark(S["bench_batch"], 32, d, repeats=S["bench_repeats"], progress=True)
    bm = pd.DataFrame(records)
    results["benchmark"] = records
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.bar(range(len(bm)), bm["images_per_s"], color=["tab:gray" if i == "loop" else "tab:green"
                                                       for i in bm["implementation"]])
    ax.set_xticks(range(len(bm)), [f"{r.kind} {r.implementation}\n{r.device}" for r in bm.itertuples()], fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("images / s (log scale)")
    ax.set_title(f"MixUp / CutMix, batch {S['bench_batch']}: per-image loop (grey) vs batched (green)")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    by = {(r["device"], r["kind"], r["implementation"]): r["measurement"] for r in records}
    return bm, by


def gpu_target_line(bm: pd.DataFrame, dev: torch.device, target: float = 50.0) -> str:
    """Whether the batched version is at least ``target`` times the loop on the GPU, from the decision rule's
    ratios; on a CPU-only machine, that the full profile measures it."""
    if dev.type != "cuda":
        return f"- no GPU here: the GPU ratio (target ≥ {target:.0f}×) is measured by the full profile on a GPU node"
    ratios = []
    for kind in bm["kind"].unique():
        rows = bm[(bm["device"] == str(dev)) & (bm["kind"] == kind)].set_index("implementation")
        d = decide(rows.loc["batched", "measurement"], rows.loc["loop", "measurement"])
        ratios.append((kind, d.low if d.outcome == "faster" else None))
    worst = [r for _, r in ratios]
    if any(r is None for r in worst):
        return f"- target on a GPU: ≥ {target:.0f}× — not shown: a kind is not faster beyond the noise"
    return (f"- target on a GPU: ≥ {target:.0f}× — {'met' if min(worst) >= target else 'NOT met'} (worst lower "
            f"bound of the interval: {min(worst):.0f}×)")


def label_weights(draws: int, path: Any = None) -> pd.DataFrame:
    """Label weights of the image's own class over ``draws`` images: torchvision's CutMix (one λ per batch), ours
    with a shared λ, ours per sample; histograms and a table of their spread within a batch."""
    from tqdm.auto import tqdm

    B = 32
    tv_cutmix = v2.CutMix(alpha=1.0, num_classes=B)
    x32, ids = torch.rand(B, 3, 32, 32), torch.arange(B)  # one class per image: its weight is its label at class i
    tv_w, ours_w, ours_shared = [], [], []
    torch.manual_seed(0)
    for _ in tqdm(range(max(1, draws // B)), desc="draws"):
        _, soft = tv_cutmix(x32, ids)
        tv_w.append(soft[ids, ids])
        ours_w.append(aug.sample_mix_params(B, 1.0, kind="cutmix", height=32, width=32).lam)
        ours_shared.append(aug.sample_mix_params(B, 1.0, kind="cutmix", height=32, width=32, per_sample=False).lam)
    named = {"torchvision": torch.stack(tv_w).float(), "ours shared λ": torch.stack(ours_shared).float(),
             "ours per sample": torch.stack(ours_w).float()}
    fig, ax = plt.subplots(1, 2, figsize=(11, 3.2))
    for name, w in named.items():
        ax[0].hist(w.flatten().numpy(), bins=torch.linspace(0, 1, 26).numpy(), histtype="step", density=True,
                   label=name)
        ax[1].hist(w.std(dim=1).numpy(), bins=20, histtype="step", label=name)
    ax[0].set_xlabel("label weight of the image's own class")
    ax[0].legend(fontsize=8)
    ax[1].set_xlabel(f"std of the label weights within a batch of {B}")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return pd.DataFrame({"mean weight": [w.mean().item() for w in named.values()],
                         "std over all draws": [w.std().item() for w in named.values()],
                         "mean std within a batch": [w.std(dim=1).mean().item() for w in named.values()]},
                        index=list(named))


def train_runs(S: dict[str, Any], train_set: Any, val_set: Any, dev: torch.device,
               mixers: dict[str, Callable | None]) -> dict[str, pd.DataFrame]:
    """One short training per mixer (None: no mixing) with the package's training loop (a progress bar per run):
    per epoch its time, the training loss, the soft training accuracy and the clean validation accuracy."""
    n_workers = min(4, core_budget()["max_workers_per_rank"])
    val_loader = data.make_loader(val_set, 256, num_workers=n_workers)
    runs = {}
    for name, mixer in mixers.items():
        torch.manual_seed(0)
        cfg = TrainConfig(epochs=S["epochs"], lr=S["lr"], optimizer="sgd_nesterov", schedule="onecycle", seed=0,
                          amp="bf16" if dev.type == "cuda" else None, log_every=10**9)
        soft_acc = TrainMetric("train_soft_accuracy", aug.soft_accuracy)

        def make_loader(generator):
            return data.make_loader(train_set, S["batch_size"], generator=generator, num_workers=n_workers,
                                    drop_last=True, pin_memory=dev.type == "cuda")

        out = train(resnet18_cifar(width=S["width"]), make_loader, cfg, dev, val_loader=val_loader,
                    batch_transform=mixer, criterion=soft_acc.wrap(soft_target_criterion()), callbacks=[soft_acc])
        runs[name] = pd.DataFrame([{k: r[k] for k in ("epoch", "seconds", "train_loss", "train_soft_accuracy",
                                                       "val_accuracy")} for r in out.records if r["event"] == "epoch"])
    return runs


def plot_runs(runs: dict[str, pd.DataFrame], path: Any = None) -> plt.Figure:
    """Training loss, soft training accuracy and clean validation accuracy per epoch, one line per run."""
    fig, ax = plt.subplots(1, 3, figsize=(13, 3.2))
    for name, df_run in runs.items():
        for a, col in zip(ax, ("train_loss", "train_soft_accuracy", "val_accuracy")):
            a.plot(df_run["epoch"], df_run[col], marker="o", label=name)
    for a, t in zip(ax, ("training loss (soft targets)", "training accuracy (soft)", "validation accuracy (clean images)")):
        a.set_title(t)
        a.set_xlabel("epoch")
    ax[0].legend()
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig
