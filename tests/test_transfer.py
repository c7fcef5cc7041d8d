"""dlo.models.load_pretrained: local weight files (torchvision format, wrapped checkpoints) and clear errors."""
from __future__ import annotations

import pytest
import torch

import dlo  # noqa: F401  (before torchvision)
import torchvision
from dlo.models import load_pretrained, resnet18_cifar


def _equal_except(a: torch.nn.Module, b: torch.nn.Module, prefixes: tuple[str, ...]) -> bool:
    sb = b.state_dict()
    return all(torch.equal(v, sb[k]) for k, v in a.state_dict().items() if not k.startswith(prefixes))


def test_torchvision_state_dict_file_into_the_cifar_resnet(tmp_path):
    torch.manual_seed(0)
    tv = torchvision.models.resnet18(num_classes=7)  # the layout of torchvision's ImageNet checkpoints
    path = tmp_path / "resnet18-local.pth"
    torch.save(tv.state_dict(), path)
    model = resnet18_cifar(num_classes=10)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=r"shape differs \(3\): conv1.weight \(64, 3, 7, 7\).*ignore="):
        load_pretrained(model, path)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items()), "a refused load changes nothing"
    info = load_pretrained(model, path, ignore=("conv1.", "fc."))
    assert info["ignored"] == ["conv1.weight", "fc.bias", "fc.weight"]
    assert len(info["loaded"]) == len(model.state_dict()) - 3
    sd = model.state_dict()
    assert all(torch.equal(sd[k], v) for k, v in tv.state_dict().items() if not k.startswith(("conv1.", "fc.")))
    assert torch.equal(sd["conv1.weight"], before["conv1.weight"]) and torch.equal(sd["fc.weight"], before["fc.weight"])


def test_wrapped_and_prefixed_checkpoints(tmp_path):
    torch.manual_seed(1)
    src = resnet18_cifar(num_classes=6, width=4)
    state = {f"module.{k}": v for k, v in src.state_dict().items()}  # as saved from a DDP-wrapped model
    path = tmp_path / "ckpt.pt"
    torch.save({"model": state, "step": 3}, path)
    dst = resnet18_cifar(num_classes=4, width=4)
    info = load_pretrained(dst, path, ignore=["fc."])
    assert _equal_except(dst, src, ("fc.",)) and info["ignored"] == ["fc.bias", "fc.weight"]
    torch.save(src.state_dict(), path)
    same = resnet18_cifar(num_classes=6, width=4)
    assert load_pretrained(same, path)["ignored"] == [] and _equal_except(same, src, ())


def test_clear_errors(tmp_path):
    model = resnet18_cifar(num_classes=4, width=4)
    with pytest.raises(FileNotFoundError, match="no weights file at .*login node"):
        load_pretrained(model, tmp_path / "missing.pth")
    other = resnet18_cifar(num_classes=4, width=8)  # other widths: every conv differs
    torch.save(other.state_dict(), tmp_path / "w8.pt")
    with pytest.raises(ValueError, match="do not match the model: shape differs"):
        load_pretrained(model, tmp_path / "w8.pt")
    partial = {k: v for k, v in model.state_dict().items() if not k.startswith("layer4.")}
    partial["extra.weight"] = torch.zeros(1)
    torch.save(partial, tmp_path / "partial.pt")
    with pytest.raises(ValueError, match=r"missing in the file \(\d+\): layer4.*not in the model \(1\): extra.weight"):
        load_pretrained(model, tmp_path / "partial.pt")
    torch.save([torch.zeros(1)], tmp_path / "list.pt")
    with pytest.raises(ValueError, match="does not hold a state dict"):
        load_pretrained(model, tmp_path / "list.pt")


def test_freezing_skips_the_backbone_backward():
    """What the notebook's frozen strategy relies on: no parameter of the backbone gets a gradient."""
    model = resnet18_cifar(num_classes=4, width=4)
    for name, p in model.named_parameters():
        p.requires_grad = name.startswith("fc.")
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    assert all((p.grad is None) != n.startswith("fc.") for n, p in model.named_parameters())
