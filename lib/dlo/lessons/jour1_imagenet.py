"""Jour 1's ladder on a workload that fills a large GPU: a torchvision ResNet-50 on ImageNet-sized images (3x224x224,
generated data of that shape), the same steps as the CIFAR ladder (fp32, bf16 autocast, channels_last,
cudnn.benchmark, torch.compile), each timed with :class:`dlo.measure.verdicts.Ladder` against the best configuration
so far and kept only beyond the noise. A ResNet-18 on 32x32 images at batch 256 leaves an H100 waiting for kernel
launches, so bf16 or compilation have little to shorten there; here each step's effect on Tensor Cores is measured
where the arithmetic is the bottleneck. Every sentence is written by the decision rule and names its workload.
"""
from __future__ import annotations

import time
from typing import Any, Mapping

import torch
from torch import nn

from dlo.data import synthetic_batch
from dlo.lessons.jour1 import ladder_view
from dlo.measure import bench, verdicts

#: The steps after the fp32 baseline: (name, change to the configuration), as in the CIFAR ladder.
STEPS = (("2 + bf16 autocast", {"dtype": "bf16"}), ("3 + channels_last", {"channels_last": True}),
         ("4 + cudnn.benchmark", {"cudnn_benchmark": True}), ("5 + torch.compile", {"compile": True}))


def workload_name(spec: Mapping[str, Any]) -> str:
    """E.g. "ResNet-50, 3x224x224 generated images, 1000 classes, batch 256"."""
    model = str(spec["model"]).replace("resnet", "ResNet-")
    return (f"{model}, 3x{spec['image']}x{spec['image']} generated images, {spec['num_classes']} classes, "
            f"batch {spec['batch']}")


def _train_step(model: nn.Module, opt: torch.optim.Optimizer, dtype: str | None):
    criterion = nn.CrossEntropyLoss()
    precision = {"bf16": torch.bfloat16}.get(dtype) if dtype else None

    def step(images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if precision is None:
            loss = criterion(model(images), labels)
        else:
            with torch.autocast(device_type=images.device.type, dtype=precision):
                loss = criterion(model(images), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.detach()

    return step


def _with_cudnn_benchmark(call):
    def wrapped():  # on for this configuration's calls only: the one it is timed against keeps its own setting
        before = torch.backends.cudnn.benchmark
        torch.backends.cudnn.benchmark = True
        try:
            return call()
        finally:
            torch.backends.cudnn.benchmark = before
    return wrapped


def make_call(spec: Mapping[str, Any], cfg: Mapping[str, Any], device: torch.device):
    """One training step of configuration ``cfg`` as a call without arguments: a fresh, identically initialised
    torchvision model (``spec["model"]``) with SGD, and one generated batch of ``spec``'s shape on ``device``."""
    import torchvision

    torch.manual_seed(0)
    model = getattr(torchvision.models, spec["model"])(num_classes=spec["num_classes"]).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-5)
    x, y = synthetic_batch(spec["batch"], device=device, size=spec["image"], num_classes=spec["num_classes"],
                           channels_last=bool(cfg.get("channels_last")))
    if cfg.get("channels_last"):
        model = model.to(memory_format=torch.channels_last)
    if cfg.get("compile"):
        model = torch.compile(model, dynamic=False)
    step = _train_step(model, opt, cfg.get("dtype"))
    call = lambda: step(x, y)  # noqa: E731
    return _with_cudnn_benchmark(call) if cfg.get("cudnn_benchmark") else call


def _why_not(spec: Mapping[str, Any] | None, device: torch.device, profile: str) -> str | None:
    if not spec:
        return f"the {profile} profile keeps the CIFAR ladder only (this second workload is for a GPU)"
    if device.type != "cuda" and profile != "dry":  # dry: the full profile's paths rehearsed on a CPU
        return f"no GPU here: the {profile} profile runs this second workload on a GPU only"
    return None


def run(results: dict[str, Any], spec: Mapping[str, Any] | None, device: torch.device, *, cifar: verdicts.Ladder,
        profile: str, warmup: bench.Warmup | int, repeats: int, max_repeats: int, baseline_repeats: int,
        progress: bool = True) -> tuple[Any, str]:
    """The ladder on ``spec``'s workload (a dict of ``model``, ``image``, ``num_classes``, ``batch``, ``compile``; None:
    not run; on a CPU only in the dry profile), recorded in ``results["imagenet"]`` (rows, final comparison, headline), and a
    markdown text that says which workload each conclusion comes from, beside what the CIFAR ladder ``cifar``
    kept. Returns (the styled table, or None when it did not run; the markdown)."""
    why = _why_not(spec, device, profile)
    if why:
        results["imagenet"] = {"ran": False, "why": why}
        return None, f"Second workload not run: {why}."
    name = workload_name(spec)
    opts = dict(warmup=warmup, repeats=repeats, max_repeats=max_repeats, progress=progress)
    lad = verdicts.Ladder(device=device.type, dtype=None, channels_last=False, batch_size=spec["batch"])
    lad.try_step("1 fp32", make_call(spec, lad.current, device), items_per_call=spec["batch"], device=device,
                 config=dict(lad.current), warmup=warmup, repeats=baseline_repeats, progress=progress)
    lines = []
    for step, change in STEPS:
        if change.get("cudnn_benchmark") and device.type != "cuda":
            lad.record(step, reason="cuDNN is NVIDIA's GPU library: nothing to tune on a CPU")
            continue
        if change.get("compile") and not spec.get("compile"):
            lad.record(step, reason=f"the {profile} profile does not compile this model (minutes on a small CPU)")
            continue
        cfg = {**lad.current, **change}
        call, extra = make_call(spec, cfg, device), {}
        if cfg.get("compile"):
            t0 = time.perf_counter()
            call()
            bench.synchronize(device)
            extra["compile_seconds"] = time.perf_counter() - t0
        row = lad.try_step(step, call, items_per_call=spec["batch"], device=device, config=cfg, **extra, **opts)
        lines.append(f"- {name}: " + verdicts.conclude(results, row, row["reference"]) +
                     f" Decision: **{row['decision']}**.")
    lad.final_comparison(repeats=baseline_repeats, max_repeats=max(baseline_repeats, max_repeats), warmup=warmup,
                         progress=progress)
    s = lad.summary()
    if lad.final is not None:
        names = lad.labels()
        headline = verdicts.conclude(results, lad.final["final"], lad.final["baseline"], a_label=names["final"],
                                     b_label=names["baseline"])
    else:
        headline = s["final_sentence"]
    results["imagenet"] = {"ran": True, "workload": name, "spec": dict(spec), "ladder": lad.table().to_dict("records"),
                           "final_comparison": {k: m.to_record() for k, m in (lad.final or {}).items()}, **s}
    table, _ = ladder_view(lad, f"Jour 1 ladder on {name} ({device})")
    return table, "\n".join(["Measured on this machine, each conclusion with the workload it comes from:", "",
                             *lines, "", f"**{name}**: {headline}", "", _side_by_side(cifar, lad, name)])


def _kept(lad: verdicts.Ladder) -> list[str]:
    return [r["step"] for r in lad.rows if r["kept"] and r["decision"] != "baseline"]


def _side_by_side(cifar: verdicts.Ladder, lad: verdicts.Ladder, name: str) -> str:
    """What each ladder kept, from its decisions, each named with its workload."""
    batch = cifar.current.get("batch_size")
    first = f"The CIFAR ladder (ResNet-18, 3x32x32, final batch {batch}) kept: {', '.join(_kept(cifar)) or 'no step'}."
    second = f"The {name} ladder kept: {', '.join(_kept(lad)) or 'no step'}."
    both = sorted(set(_kept(lad)) - {r.get("retry_of") or r["step"] for r in cifar.rows if r["kept"]})
    more = f" Kept on {name} but not by the CIFAR ladder: {', '.join(both)}." if both else ""
    return f"{first} {second}{more}"
