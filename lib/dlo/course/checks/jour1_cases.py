"""Generated cases for Jour 1's training-step checkers (amp, fp16, fp16_clip), evaluation and memory layout.

A case is a small seeded model (convolutional or linear, several widths, with or without BatchNorm and Dropout),
a batch (sizes 1, odd and even, images of odd sides), an optimizer with state (SGD with momentum), a criterion
(plain or label-smoothed cross-entropy, some scaled up so the gradient norm is large) and, for the fp16 steps, a
GradScaler whose initial scale overflows float16 or does not. The student's function and the reference run on
fresh copies of the same case for two consecutive steps (a second step shows gradients left over from the first);
what is compared is everything a training step leaves behind: the losses returned, the weights (which covers the
gradients), the optimizer's momentum buffers, the scaler's scale and growth tracker, and the model's mode.

The cases come from :func:`dlo.course.checks.cases.seeded`; the reasons for a generator of our own are given there.
"""
from __future__ import annotations

import random
from typing import Any, Callable

import torch
from torch import nn

from dlo.course.checks.cases import Case, compare, run_student, seeded
from dlo.course.checks.framework import CheckFailed

CLASSES = (10, 3, 7)


def make_model(kind: str, width: int, norm: bool, dropout: bool, seed: int, classes: int = 10,
               side: int = 5) -> nn.Module:
    """A small seeded classifier of 3 x side x side images. BatchNorm's running statistics are drawn away from
    (0, 1), so that eval mode and train mode give different outputs."""
    torch.manual_seed(seed)
    if kind == "conv":
        layers: list[nn.Module] = [nn.Conv2d(3, width, 3, padding=1, bias=not norm)]
        layers += [nn.BatchNorm2d(width)] if norm else []
        layers += [nn.ReLU(), nn.Conv2d(width, width, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten()]
    else:
        layers = [nn.Flatten(), nn.Linear(3 * side * side, width)]
        layers += [nn.BatchNorm1d(width)] if norm else []
        layers += [nn.ReLU()]
    layers += [nn.Dropout(0.3)] if dropout else []
    layers += [nn.Linear(width, classes)]
    model = nn.Sequential(*layers)
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            nn.init.uniform_(m.weight, 0.5, 1.5)
            nn.init.uniform_(m.bias, -0.2, 0.2)
    return model


def record_state(model: nn.Module) -> list[dict[str, Any]]:
    """Install a forward pre-hook on ``model`` that records, at each call, the autocast / grad / mode state seen."""
    seen: list[dict[str, Any]] = []

    def hook(module: nn.Module, args: tuple) -> None:
        dev = args[0].device.type if args and isinstance(args[0], torch.Tensor) else "cpu"
        on = torch.is_autocast_enabled(dev)
        seen.append({"autocast": on, "dtype": torch.get_autocast_dtype(dev) if on else None,
                     "grad": torch.is_grad_enabled(), "inference": torch.is_inference_mode_enabled(),
                     "training": module.training})

    model.register_forward_pre_hook(hook)
    return seen


def batch(n: int, side: int, classes: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, side, side, generator=g), torch.randint(0, classes, (n,), generator=g)


def criterion_of(name: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """'ce' (nn.CrossEntropyLoss), 'smooth' (label smoothing 0.2: another criterion than the default one) or
    'ce x20' (a loss 20 times larger: gradient norms around 10)."""
    if name == "smooth":
        return nn.CrossEntropyLoss(label_smoothing=0.2)
    if name == "ce x20":
        return lambda out, target: 20.0 * nn.functional.cross_entropy(out, target)
    return nn.CrossEntropyLoss()


def _model_label(s: dict) -> str:
    extras = [w for w, on in (("BatchNorm", s["norm"]), ("Dropout", s["dropout"])) if on]
    return f"a {s['kind']} model of width {s['width']}" + (f" with {' and '.join(extras)}" if extras else "")


def step_case(rng: random.Random, *, dtypes: tuple, criteria: tuple, scales: tuple = (None,),
              clips: tuple = (None,)) -> Case:
    """One drawn training-step case."""
    kind = rng.choice(["conv", "linear"])
    s = {"kind": kind, "width": rng.choice([2, 5, 8, 16]), "norm": rng.random() < 0.5, "dropout": rng.random() < 0.4,
         "seed": rng.randint(0, 10 ** 6), "n": rng.choice([1, 2, 3, 5, 8, 11]), "side": rng.choice([3, 5, 6]),
         "classes": rng.choice(CLASSES), "dtype": rng.choice(dtypes), "criterion": rng.choice(criteria),
         "init_scale": rng.choice(scales), "momentum": rng.choice([0.0, 0.9]), "clip": rng.choice(clips)}
    if kind == "linear" and s["norm"] and s["n"] == 1:
        s["n"] = 2  # BatchNorm1d cannot train on one sample
    return spec_case(s)


def spec_case(s: dict) -> Case:
    label = (f"{_model_label(s)}, batch {s['n']}, {str(s['dtype']).replace('torch.', '')}, "
             f"criterion {s['criterion']}, SGD momentum {s['momentum']}")
    if s.get("init_scale"):
        label += f", GradScaler(init_scale=2**{int(s['init_scale']).bit_length() - 1})"
    if s.get("clip") is not None:
        label += f", max_norm {s['clip']} x the gradient norm"
    return Case(label, {"spec": s}, size=s["n"] * s["width"] * (2 if s["kind"] == "conv" else 1))


def fixed_step(**over: Any) -> Case:
    s = {"kind": "conv", "width": 4, "norm": True, "dropout": False, "seed": 0, "n": 8, "side": 5, "classes": 10,
         "dtype": torch.bfloat16, "criterion": "ce", "init_scale": None, "momentum": 0.9}
    s.update(over)
    return spec_case(s)


def step_cases(n: int, *, dtypes: tuple, criteria: tuple, scales: tuple = (None,), clips: tuple = (None,),
               fixed: list[Case] = (), seed: int = 0) -> list[Case]:
    return seeded(lambda rng: step_case(rng, dtypes=dtypes, criteria=criteria, scales=scales, clips=clips), n,
                  seed=seed, fixed=fixed)


class Run:
    """A fresh model, optimizer, criterion, batches (and scaler) built from a case's spec."""

    def __init__(self, s: dict, lr: float = 0.1) -> None:
        self.s = s
        self.model = make_model(s["kind"], s["width"], s["norm"], s["dropout"], s["seed"], s["classes"], s["side"])
        self.seen = record_state(self.model)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=lr, momentum=s["momentum"])
        self.criterion = criterion_of(s["criterion"])
        self.batches = [batch(s["n"], s["side"], s["classes"], s["seed"] + k) for k in (1, 2)]
        self.scaler = (torch.amp.GradScaler("cpu", init_scale=s["init_scale"], growth_interval=1)
                       if s.get("init_scale") else None)

    def state(self, k: int, loss: Any) -> dict[str, Any]:
        """What step ``k`` (1, 2) left behind, by name (compared between the student's run and the reference's)."""
        after = f"after step {k}"
        out: dict[str, Any] = {f"the loss returned by step {k}": loss}
        for name, p in self.model.named_parameters():
            out[f"the weight {name} {after}"] = p.detach().clone()
        for name, p in self.model.named_parameters() if self.s["momentum"] else ():
            buf = self.opt.state.get(p, {}).get("momentum_buffer")
            out[f"the optimizer's momentum buffer of {name} {after}"] = None if buf is None else buf.clone()
        if self.scaler is not None:
            out[f"the scaler's scale {after}"] = float(self.scaler.get_scale())
            out[f"the scaler's growth tracker {after}"] = int(self.scaler.state_dict().get("_growth_tracker", 0))
        out[f"the model's training mode {after}"] = self.model.training
        return out


def run_steps(fn: Callable, s: dict, call: Callable[[Callable, Run, tuple], Any], steps: int = 2) -> tuple[Run, dict]:
    """``steps`` consecutive calls of ``fn`` on a fresh :class:`Run` of ``s`` (dropout seeded the same way); the
    state after each, in order."""
    run = Run(s)
    state: dict[str, Any] = {}
    for k in range(steps):
        torch.manual_seed(1000 + k)
        loss = call(fn, run, run.batches[k])
        state.update(run.state(k + 1, loss.detach().clone() if isinstance(loss, torch.Tensor) else loss))
    return run, state


def first_difference(got: dict, want: dict, rel: float = 1e-4) -> str | None:
    """The first entry, in the order the steps left them, where ``got`` differs from ``want``."""
    for key, w in want.items():
        g = got.get(key)
        if isinstance(w, torch.Tensor) and "loss" not in key:  # weights, buffers: relative to the largest value
            problem = compare(g, w, key, of_largest=rel)
        else:
            problem = compare(g, w, key, dtype=torch.float32, scale=10)
        if problem:
            return problem
    return None


def expect_same_steps(cases: list[Case], student: Callable, reference: Callable,
                      call: Callable[[Callable, Run, tuple], Any], inspect: Callable[[Case, Run], None] | None = None
                      ) -> int:
    """Run the student's step and the reference on every case; raise ``with <case>: <difference>`` at the first
    (smallest) case where they differ. ``inspect(case, run)`` may name a known mistake from the student's run."""
    for case in cases:
        s = case.kwargs["spec"]
        ref_run, want = run_steps(reference, s, call)
        got_run, got = run_student(lambda spec: run_steps(student, spec, call), case)
        if inspect is not None:
            inspect(case, got_run)
        problem = first_difference(got, want)
        if problem:
            raise CheckFailed(f"with {case.label}: {problem}")
    return len(cases)


# The fixed model of the checks' first phase: it records the state its forward ran in.

class Recorder(nn.Module):
    """A tiny conv net that records the autocast / grad / training state seen during its forward."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4, 10)
        self.seen: list[dict[str, Any]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dev = x.device.type
        self.seen.append({
            "autocast": torch.is_autocast_enabled(dev),
            "dtype": torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else None,
            "grad": torch.is_grad_enabled(),
            "inference": torch.is_inference_mode_enabled(),
            "training": self.training,
        })
        h = torch.relu(self.bn(self.conv(x)))
        return self.fc(h.mean(dim=(2, 3)))


def small_batch(n: int = 8, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g)


def params_changed(model: nn.Module, before: dict[str, torch.Tensor]) -> bool:
    return any(not torch.equal(p.detach(), before[n]) for n, p in model.named_parameters())


def snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}
