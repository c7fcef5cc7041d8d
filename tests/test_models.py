"""Tests of dlo.models: the CIFAR ResNet-18 (size, shapes, stem, width) and ConvBNReLU."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import dlo  # noqa: F401  (before torchvision: prepares its import)
from dlo.models import ConvBNReLU, count_parameters, resnet18_cifar


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One intra-op thread: on 2 shared cores, two OpenMP threads that wait on each other at every layer are
    many times slower as soon as another process runs (the results under test do not depend on it)."""
    from dlo.measure.records import torch_threads

    with torch_threads(1):
        yield


def test_standard_width_has_resnet18_parameter_count():
    model = resnet18_cifar()
    assert count_parameters(model) == 11_173_962
    assert count_parameters(resnet18_cifar(width=64)) == 11_173_962


def test_count_parameters_trainable_only():
    model = resnet18_cifar(width=4)
    total = count_parameters(model)
    model.fc.weight.requires_grad_(False)
    assert count_parameters(model) == total
    assert count_parameters(model, trainable_only=True) == total - model.fc.weight.numel()


@pytest.mark.parametrize("size", [(32, 32), (40, 48), (16, 16)])
def test_output_shape(size):
    torch.manual_seed(0)
    model = resnet18_cifar(width=4).eval()
    with torch.no_grad():
        out = model(torch.randn(3, 3, *size))
    assert out.shape == (3, 10)
    assert torch.isfinite(out).all()


def test_num_classes():
    model = resnet18_cifar(num_classes=7, width=4).eval()
    with torch.no_grad():
        assert model(torch.randn(2, 3, 32, 32)).shape == (2, 7)
    assert model.fc.out_features == 7


@pytest.mark.parametrize("width", [1, 4, 8, 16])
def test_width_scales_channels(width):
    model = resnet18_cifar(width=width)
    assert model.conv1.out_channels == width
    assert model.bn1.num_features == width
    assert model.layer1[0].conv1.out_channels == width
    assert model.layer2[0].conv1.out_channels == 2 * width
    assert model.layer3[0].conv1.out_channels == 4 * width
    assert model.layer4[-1].conv2.out_channels == 8 * width
    assert model.fc.in_features == 8 * width


def test_width_changes_parameter_count():
    assert count_parameters(resnet18_cifar(width=4)) < count_parameters(resnet18_cifar(width=8))


@pytest.mark.parametrize("width", [0, -1, 2.5, True, "64", None])
def test_bad_width_raises(width):
    with pytest.raises(ValueError, match="width"):
        resnet18_cifar(width=width)


@pytest.mark.parametrize("num_classes", [0, -3, 2.0])
def test_bad_num_classes_raises(num_classes):
    with pytest.raises(ValueError, match="num_classes"):
        resnet18_cifar(num_classes=num_classes, width=4)


def test_stem_is_3x3_stride1_without_maxpool():
    model = resnet18_cifar(width=4)
    assert model.conv1.kernel_size == (3, 3)
    assert model.conv1.stride == (1, 1)
    assert model.conv1.padding == (1, 1)
    assert model.conv1.bias is None
    assert isinstance(model.maxpool, nn.Identity)
    assert not any(isinstance(m, nn.MaxPool2d) for m in model.modules())


def test_spatial_sizes_through_the_network():
    """32x32 in: layer1 still at 32x32 (no stem downsampling), layer4 at 4x4."""
    model = resnet18_cifar(width=4).eval()
    shapes = {}

    def hook(name):
        def fn(module, inputs, output):
            shapes[name] = tuple(output.shape)
        return fn

    handles = [getattr(model, n).register_forward_hook(hook(n)) for n in ("conv1", "layer1", "layer2", "layer3", "layer4")]
    try:
        with torch.no_grad():
            model(torch.randn(2, 3, 32, 32))
    finally:
        for h in handles:
            h.remove()
    assert shapes["conv1"] == (2, 4, 32, 32)
    assert shapes["layer1"] == (2, 4, 32, 32)
    assert shapes["layer2"] == (2, 8, 16, 16)
    assert shapes["layer3"] == (2, 16, 8, 8)
    assert shapes["layer4"] == (2, 32, 4, 4)


def test_initialisation_follows_torchvision():
    model = resnet18_cifar(width=4)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            assert torch.equal(m.weight, torch.ones_like(m.weight))
            assert torch.equal(m.bias, torch.zeros_like(m.bias))


def test_backward_reaches_every_parameter():
    model = resnet18_cifar(width=4)
    loss = nn.functional.cross_entropy(model(torch.randn(4, 3, 32, 32)), torch.tensor([0, 1, 2, 3]))
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())


def test_conv_bn_relu_has_no_conv_bias_by_default():
    block = ConvBNReLU(3, 5)
    conv, bn, relu = block
    assert isinstance(conv, nn.Conv2d) and isinstance(bn, nn.BatchNorm2d) and isinstance(relu, nn.ReLU)
    assert conv.bias is None
    assert conv.kernel_size == (3, 3) and conv.padding == (1, 1)
    assert conv.out_channels == bn.num_features == 5
    assert ConvBNReLU(3, 5, bias=True)[0].bias is not None
    out = block(torch.randn(2, 3, 8, 8))
    assert out.shape == (2, 5, 8, 8)
    assert (out >= 0).all()
