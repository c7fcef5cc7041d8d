"""Models used across the workbook.

CIFAR-10 images are 32x32. torchvision's ResNet-18 is built for 224x224 ImageNet images: its 7x7 stride-2
stem followed by a max-pool shrinks a 32x32 image to 8x8 before the first residual block, which wastes
most of the network. The usual CIFAR adaptation (used here) replaces the stem by a 3x3 stride-1
convolution and drops the max-pool.

``width`` scales every layer's channel count (64 for the real ResNet-18) so that CPU smoke runs can use a
tiny network with the very same architecture.
"""
from __future__ import annotations

import re

import torch
from torch import nn

import dlo  # noqa: F401  (torchvision shim)
from torchvision.models.resnet import BasicBlock, ResNet


class CifarResNet18(ResNet):
    """torchvision's ResNet with BasicBlocks [2, 2, 2, 2], a 3x3 stride-1 stem and no max-pool.

    Reuses torchvision's ``BasicBlock`` and ``ResNet._make_layer``; only the stem and the channel
    widths differ (``width`` channels in the first stage, doubled at each of the next three).
    """

    def __init__(self, num_classes: int = 10, width: int = 64) -> None:
        nn.Module.__init__(self)
        self._norm_layer = nn.BatchNorm2d
        self.inplanes, self.dilation, self.groups, self.base_width = width, 1, 1, 64
        self.conv1 = nn.Conv2d(3, width, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.Identity()
        self.layer1 = self._make_layer(BasicBlock, width, 2)
        self.layer2 = self._make_layer(BasicBlock, width * 2, 2, stride=2)
        self.layer3 = self._make_layer(BasicBlock, width * 4, 2, stride=2)
        self.layer4 = self._make_layer(BasicBlock, width * 8, 2, stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(width * 8, num_classes)
        for m in self.modules():  # torchvision's initialisation
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)


def resnet18_cifar(num_classes: int = 10, width: int = 64) -> nn.Module:
    """ResNet-18 for 32x32 inputs. ``width=64`` is the standard network (11.2 M parameters)."""
    if not isinstance(width, int) or isinstance(width, bool) or width < 1:
        raise ValueError(f"width must be a positive integer (64 is the standard ResNet-18), got {width!r}")
    if not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes < 1:
        raise ValueError(f"num_classes must be a positive integer, got {num_classes!r}")
    return CifarResNet18(num_classes=num_classes, width=width)


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


class ConvBNReLU(nn.Sequential):
    """conv -> BN -> ReLU. ``bias`` defaults to False: BatchNorm subtracts the mean right after the
    convolution, so a convolution bias is cancelled out and only costs memory and time."""

    def __init__(self, c_in: int, c_out: int, bias: bool = False) -> None:
        super().__init__(nn.Conv2d(c_in, c_out, 3, padding=1, bias=bias), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True))


class Residual(nn.Module):
    """``x + f(x)``: the skip connection of a residual block."""

    def __init__(self, *layers: nn.Module) -> None:
        super().__init__()
        self.f = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.f(x)


class Scale(nn.Module):
    """Multiply by a constant (ResNet-9's logits are scaled by 1/8: smaller logits, calmer early training)."""

    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factor


def resnet9(num_classes: int = 10, width: int = 64) -> nn.Module:
    """David Page's ResNet-9 ("How to train your ResNet", 2018), built from :class:`dlo.models.resnets.ConvBNReLU`.

    prep conv (``width``) -> [conv 2w, max-pool, residual of two convs] -> [conv 4w, max-pool] ->
    [conv 8w, max-pool, residual of two convs] -> global max-pool -> linear -> x 1/8. Eight convolutions
    and one linear layer, wide rather than deep: few, large kernels keep a GPU busy, which makes it
    faster to train to 94 % than ResNet-18 (``width=64`` is the original network, 6.6 M parameters).
    """
    if not isinstance(width, int) or isinstance(width, bool) or width < 1:
        raise ValueError(f"width must be a positive integer (64 is the original ResNet-9), got {width!r}")
    w = width
    return nn.Sequential(
        ConvBNReLU(3, w),
        ConvBNReLU(w, 2 * w), nn.MaxPool2d(2), Residual(ConvBNReLU(2 * w, 2 * w), ConvBNReLU(2 * w, 2 * w)),
        ConvBNReLU(2 * w, 4 * w), nn.MaxPool2d(2),
        ConvBNReLU(4 * w, 8 * w), nn.MaxPool2d(2), Residual(ConvBNReLU(8 * w, 8 * w), ConvBNReLU(8 * w, 8 * w)),
        nn.AdaptiveMaxPool2d(1), nn.Flatten(), nn.Linear(8 * w, num_classes, bias=False), Scale(0.125),
    )


def load_pretrained(model: nn.Module, path, *, ignore: tuple[str, ...] | list[str] = (),
                    map_location: str | torch.device = "cpu") -> dict:
    """Load pretrained weights from a **local file** into ``model`` (compute nodes have no internet, so
    ``torchvision.models.resnet18(weights="DEFAULT")`` cannot download them there).

    ``path``: a state-dict file as torchvision saves them (``~/.cache/torch/hub/checkpoints/resnet18-f37072fd.pth``
    after a download on a login node), a ``torch.save(model.state_dict(), path)`` file, or a dlo checkpoint
    (its ``"model"`` entry). Prefixes added by DDP (``module.``) or torch.compile (``_orig_mod.``) are removed.
    ``ignore``: key prefixes to leave out, for layers you replace or that differ, e.g. ``("fc.",)`` for a new
    head, ``("conv1.", "fc.")`` for ImageNet weights into :func:`resnet18_cifar` (its stem is 3x3, not 7x7).
    Those layers keep their current (random) values.

    Every other parameter and buffer must match by name and shape, else a ValueError lists what differs.
    Returns ``{"loaded": [...keys], "ignored": [...keys]}``.
    """
    from pathlib import Path

    file = Path(path).expanduser()
    if not file.is_file():
        raise FileNotFoundError(f"no weights file at {file}: compute nodes cannot download; fetch the weights on a "
                                "login node (e.g. torchvision.models.resnet18(weights='DEFAULT') fills "
                                "~/.cache/torch/hub/checkpoints/) and pass that file's path")
    try:  # weights_only: a file naming any Python object besides tensors and plain values is refused unrun
        state = torch.load(file, map_location=map_location, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch's messages are paragraphs: one line instead
        found = re.search(r"GLOBAL (\S+) was not an allowed global", str(exc))
        why = (f"it asks to load {found.group(1)}, which a weights file never holds (refused without running it: "
               f"it may be crafted to run code)" if found else f"truncated, empty or not a torch file ({type(exc).__name__})")
        raise ValueError(f"{file} cannot be loaded as weights: {why}; use a file written by torch.save(model.state_dict(), "
                         f"path)") from None
    for wrapper in ("model", "state_dict"):
        if isinstance(state, dict) and isinstance(state.get(wrapper), dict):
            state = state[wrapper]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{file} does not hold a state dict (name -> tensor): save one with "
                         "torch.save(model.state_dict(), path)")
    clean = {}
    for key, value in state.items():
        for prefix in ("module.", "_orig_mod."):
            while key.startswith(prefix):
                key = key[len(prefix):]
        clean[key] = value
    ignore = tuple(ignore)
    target = model.state_dict()
    skipped = sorted(k for k in set(clean) | set(target) if ignore and k.startswith(ignore))
    wanted = {k: v for k, v in clean.items() if not (ignore and k.startswith(ignore))}
    expected = {k for k in target if not (ignore and k.startswith(ignore))}
    missing = sorted(expected - set(wanted))
    unexpected = sorted(set(wanted) - set(target))
    mismatched = sorted(f"{k} {tuple(wanted[k].shape)} in the file vs {tuple(target[k].shape)} in the model"
                        for k in expected & set(wanted) if wanted[k].shape != target[k].shape)
    if missing or unexpected or mismatched:
        parts = [f"{label} ({len(keys)}): {', '.join(keys[:4])}{', ...' if len(keys) > 4 else ''}"
                 for label, keys in (("missing in the file", missing), ("not in the model", unexpected),
                                     ("shape differs", mismatched)) if keys]
        raise ValueError(f"the weights in {file} do not match the model: {'; '.join(parts)}. Pass ignore=(...) "
                         "with the prefixes of the layers you replace (e.g. ('fc.',) for a new head)")
    model.load_state_dict(wanted, strict=False)
    return {"loaded": sorted(wanted), "ignored": skipped}
