"""The backbones the transfer checkers try, and how two models are compared (outputs and every parameter's gradient).

Four backbones, each with its pretrained head at ``model.fc`` (a Linear with a bias, as in torchvision): two
ResNet-18s of different widths (BatchNorm, convolutions without bias), a small convolutional net (a convolution with a
bias, a Linear without one) and an MLP-block net whose blocks hold layers named ``mlp.fc1`` / ``mlp.fc2`` and whose
``fc`` is registered before the final norm (so the head is neither "every name with fc in it" nor the last child).
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from dlo.course.checks.cases import compare
from dlo.models.resnets import resnet18_cifar


class _ConvNet(nn.Module):
    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 3, padding=1, bias=True)
        self.bn1 = nn.BatchNorm2d(6)
        self.conv2 = nn.Conv2d(6, 10, 3, stride=2, bias=False)
        self.proj = nn.Linear(10, 12, bias=False)
        self.fc = nn.Linear(12, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv2(torch.relu(self.bn1(self.conv1(x))))
        return self.fc(torch.relu(self.proj(x.mean((2, 3)))))


class _Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.mlp = nn.Sequential()
        self.mlp.add_module("fc1", nn.Linear(dim, 2 * dim))
        self.mlp.add_module("act", nn.GELU())
        self.mlp.add_module("fc2", nn.Linear(2 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class _MlpNet(nn.Module):
    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 7, 4, stride=4, bias=True)
        self.blocks = nn.Sequential(_Block(7), _Block(7))
        self.fc = nn.Linear(7, num_classes)  # registered before the final norm, used after it
        self.norm = nn.BatchNorm1d(7)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.norm(self.blocks(self.stem(x).mean((2, 3)))))


#: (description, builder): each builds the same weights every time it is called.
BACKBONES: tuple[tuple[str, Callable[[], nn.Module]], ...] = (
    ("a width-4 ResNet-18 with a 6-class head", lambda: resnet18_cifar(num_classes=6, width=4)),
    ("a small conv net (a convolution with a bias, a Linear without) with a 5-class head", lambda: _ConvNet(5)),
    ("an MLP-block net (layers named mlp.fc1, mlp.fc2; fc registered before the last norm) with a 4-class head",
     lambda: _MlpNet(4)),
    ("a width-8 ResNet-18 with a 10-class head", lambda: resnet18_cifar(num_classes=10, width=8)),
)


def build(index: int) -> nn.Module:
    torch.manual_seed(10 + index)
    return BACKBONES[index][1]()


def images(seed: int = 0) -> torch.Tensor:
    return torch.randn(3, 3, 8, 8, generator=torch.Generator().manual_seed(seed))


def forward_backward(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor | None]]:
    """The model's output in training mode and each parameter's gradient (by name) for a seeded cotangent."""
    model.train()
    model.zero_grad(set_to_none=True)
    out = model(x)
    g = torch.Generator().manual_seed(1)
    out.backward(torch.randn(out.shape, generator=g))
    return out.detach(), {n: (None if p.grad is None else p.grad.detach().clone()) for n, p in model.named_parameters()}


def same_effect(got_model: nn.Module, want_model: nn.Module, x: torch.Tensor) -> str | None:
    """None when the two models give the same output and the same gradients (present on the same parameters, equal
    values); else one line naming the first difference."""
    got, got_g = forward_backward(got_model, x)
    want, want_g = forward_backward(want_model, x)
    problem = compare(got, want, "the model's output")
    if problem:
        return problem
    for name, w in want_g.items():
        g = got_g.get(name)
        if (g is None) != (w is None):
            return (f"{name} {'gets no gradient' if g is None else 'gets a gradient'} after backward, expected "
                    f"{'one' if w is not None else 'none'}")
        if w is not None:
            problem = compare(g, w, f"the gradient of {name}")
            if problem:
                return problem
    return None


def copy_head(src: nn.Linear, dst: nn.Linear) -> None:
    """Give ``dst`` the weights of ``src`` (a new head is drawn at random: compare the rest with the same head)."""
    with torch.no_grad():
        dst.weight.copy_(src.weight)
        if dst.bias is not None and src.bias is not None:
            dst.bias.copy_(src.bias)
