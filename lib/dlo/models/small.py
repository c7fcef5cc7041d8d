"""The small networks the lessons use (MLPs, a small CNN, nets for DDP's unused-parameter lesson).
"""
from __future__ import annotations
from typing import Union

import torch
from torch import nn

from typing import Sequence




# ----------------------------------------------------------------------------------------------------
# Models for the find_unused_parameters lesson
# ----------------------------------------------------------------------------------------------------
class ConditionalHeadsNet(nn.Module):
    """A small conv backbone with two heads; each call uses only one (a multi-task model, one task per batch).

    ``forward(x, head)`` with ``head`` in ``"a"``/``"b"`` (or 0/1). The head that is not used produces no
    gradient in that backward, so DDP waits forever for its bucket to be ready: the all-reduce of that
    bucket (and of every later one, buckets go in order) never starts, and the *next* forward raises
    ``RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one
    ... find_unused_parameters=True ...``. With ``find_unused_parameters=True`` DDP walks the autograd
    graph after each forward, marks the parameters it cannot reach as ready (their gradient averaged as
    zero) and the model trains; the walk costs time on every step, so the flag is off by default.
    """

    heads_names = ("a", "b")

    def __init__(self, num_classes: int = 10, width: int = 16) -> None:
        super().__init__()
        if not isinstance(width, int) or isinstance(width, bool) or width < 1:
            raise ValueError(f"width must be a positive integer, got {width!r}")
        self.backbone = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(width, 2 * width, 3, stride=2, padding=1), nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        )
        self.heads = nn.ModuleDict({name: nn.Linear(2 * width, num_classes) for name in self.heads_names})

    def forward(self, x: torch.Tensor, head: Union[str, int] = "a") -> torch.Tensor:
        if isinstance(head, int) and not isinstance(head, bool) and 0 <= head < len(self.heads_names):
            head = self.heads_names[head]
        if head not in self.heads:
            raise ValueError(
                f"unknown head {head!r}: use one of {list(self.heads_names)} or 0..{len(self.heads_names) - 1}"
            )
        return self.heads[head](self.backbone(x))


def stochastic_depth(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """Per-sample stochastic depth: ``torchvision.ops.stochastic_depth(x, p, mode="row", training)``.

    Each sample's branch is kept with probability ``1 - p`` and then scaled by ``1 / (1 - p)`` (so the
    expected output is unchanged), or multiplied by zero. Same random draws as torchvision's version;
    written out here because ``import torchvision`` costs seconds in every process a launcher starts.
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"drop probability p must be in [0, 1], got {p!r}")
    if not training or p == 0.0:
        return x
    survival = 1.0 - p
    mask = torch.empty([x.shape[0]] + [1] * (x.ndim - 1), dtype=x.dtype, device=x.device).bernoulli_(survival)
    if survival > 0.0:
        mask.div_(survival)
    return x * mask


class _StochasticBlock(nn.Module):
    def __init__(self, width: int, p: float) -> None:
        super().__init__()
        self.p = p
        self.body = nn.Sequential(
            nn.Conv2d(width, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, padding=1, bias=False), nn.BatchNorm2d(width),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + stochastic_depth(self.body(x), self.p, training=self.training))


class StochasticDepthNet(nn.Module):
    """Residual blocks whose branch is dropped at random per sample (stochastic depth), DDP-friendly.

    :func:`stochastic_depth` (``torchvision.ops.stochastic_depth(..., mode="row")``) multiplies each
    sample's branch by a Bernoulli mask scaled by ``1 / (1 - p)``. The branch is still computed and
    still in the autograd graph, so a dropped block gets a (zero) gradient and DDP needs no
    ``find_unused_parameters``: every parameter is reached by every backward. An implementation that
    *skips* the block with a Python ``if`` would leave its parameters unused on that step (and, since
    each rank draws its own random numbers, on some ranks only): that one needs
    ``find_unused_parameters=True`` and is slower.
    """

    def __init__(self, num_classes: int = 10, width: int = 16, depth: int = 4, p: float = 0.2) -> None:
        super().__init__()
        if not isinstance(width, int) or isinstance(width, bool) or width < 1:
            raise ValueError(f"width must be a positive integer, got {width!r}")
        if not isinstance(depth, int) or isinstance(depth, bool) or depth < 1:
            raise ValueError(f"depth must be a positive integer, got {depth!r}")
        if not 0.0 <= p < 1.0:
            raise ValueError(f"p (probability of dropping a block) must be in [0, 1), got {p!r}")
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True)
        )
        self.blocks = nn.Sequential(*[_StochasticBlock(width, p) for _ in range(depth)])
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)))


class TinyMLP(nn.Sequential):
    """Average-pool the 32x32 image to 8x8, then one hidden layer: a model that trains in milliseconds."""

    def __init__(self, hidden: int = 64, num_classes: int = 10) -> None:
        super().__init__(nn.AvgPool2d(4), nn.Flatten(), nn.Linear(3 * 8 * 8, hidden), nn.ReLU(),
                         nn.Linear(hidden, num_classes))


class SmallCNN(nn.Sequential):
    """Three conv -> BN -> ReLU blocks (each halving the image), global average pooling, a linear head.

    With ``width=8`` about 6 k parameters: a student a hundred times smaller than a ResNet-18 of width 16.
    """

    def __init__(self, width: int = 8, num_classes: int = 10) -> None:
        if not isinstance(width, int) or isinstance(width, bool) or width < 1:
            raise ValueError(f"width must be a positive integer, got {width!r}")
        layers: list[nn.Module] = []
        c_in = 3
        for c_out in (width, 2 * width, 4 * width):
            layers += [nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True),
                       nn.MaxPool2d(2)]
            c_in = c_out
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c_in, num_classes)]
        super().__init__(*layers)


class MLP(nn.Sequential):
    """A classifier on flattened images: ``in -> hidden -> ... -> classes`` with ReLUs. Nearly all its
    parameters and time are in its ``nn.Linear`` layers, which is what dynamic quantization converts."""

    def __init__(self, in_features: int = 3 * 32 * 32, hidden: Sequence[int] = (1024, 1024),
                 num_classes: int = 10) -> None:
        layers: list[nn.Module] = [nn.Flatten()]
        for h in hidden:
            layers += [nn.Linear(in_features, h), nn.ReLU(inplace=True)]
            in_features = h
        layers.append(nn.Linear(in_features, num_classes))
        super().__init__(*layers)
