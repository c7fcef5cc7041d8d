"""Tests of dlo.data.augment: MixUp / CutMix semantics, loop == batched, torchvision parity, loss and accuracy, benchmark."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

import dlo  # noqa: F401  (before torchvision: prepares its import)
from dlo.data import augment as A
from dlo.data.augment import MixCutMix, MixParams
from dlo.runtime.paths import ROOT
from dlo.lessons import mixing

FAST = settings(max_examples=25, deadline=None, database=None)


def constant_batch(b: int, c: int, h: int, w: int, dtype=torch.float32) -> torch.Tensor:
    """Image i is the constant i + 1: every output pixel tells which sample it came from."""
    return (torch.arange(b, dtype=dtype) + 1).view(b, 1, 1, 1).expand(b, c, h, w).contiguous()


def ks_statistic(a, b) -> float:
    """Two-sample Kolmogorov-Smirnov statistic: the largest gap between the two empirical CDFs."""
    a, b = np.sort(np.asarray(a)), np.sort(np.asarray(b))
    grid = np.concatenate([a, b])
    cdf_a = np.searchsorted(a, grid, side="right") / len(a)
    cdf_b = np.searchsorted(b, grid, side="right") / len(b)
    return float(np.abs(cdf_a - cdf_b).max())


def params_for(kind, b, h, w, alpha=1.0, seed=0, per_sample=True):
    gen = torch.Generator().manual_seed(seed)
    return A.sample_mix_params(b, alpha, kind=kind, height=h, width=w, per_sample=per_sample, generator=gen)


APPLY = {"mixup": (A.mixup_reference, A.mixup), "cutmix": (A.cutmix_reference, A.cutmix)}


# --------------------------------------------------------------------------------------------------
# CutMix: boxes and label weights
# --------------------------------------------------------------------------------------------------

@FAST
@given(b=st.integers(1, 6), h=st.integers(1, 17), w=st.integers(1, 17), alpha=st.floats(0.05, 5.0),
       seed=st.integers(0, 2**31 - 1), per_sample=st.booleans())
def test_cutmix_partner_fraction_equals_one_minus_label_weight(b, h, w, alpha, seed, per_sample):
    params = params_for("cutmix", b, h, w, alpha, seed, per_sample)
    images = constant_batch(b, 2, h, w)
    out, soft = A.cutmix(images, torch.arange(b), params, num_classes=b)
    perm, boxes = params.perm.tolist(), params.boxes.tolist()
    for i in range(b):
        y0, y1, x0, x1 = boxes[i]
        assert 0 <= y0 <= y1 <= h and 0 <= x0 <= x1 <= w  # inside the image, half-open
        if b > 1:
            assert perm[i] != i  # a real partner
        inside = torch.zeros(h, w, dtype=torch.bool)
        inside[y0:y1, x0:x1] = True
        expected = torch.where(inside, float(perm[i] + 1), float(i + 1))
        assert torch.equal(out[i], expected.expand(2, h, w))  # partner pixels exactly in the box, own elsewhere
        area = (y1 - y0) * (x1 - x0)
        assert params.lam[i].item() == 1 - area / (h * w)  # the label weight is the pasted area
        if b > 1:
            from_partner = (out[i, 0] == perm[i] + 1).sum().item()
            assert from_partner == area
            assert math.isclose(from_partner / (h * w), 1 - params.lam[i].item(), rel_tol=0, abs_tol=1e-12)
            assert math.isclose(soft[i, perm[i]].item(), 1 - params.lam[i].item(), abs_tol=1e-6)


def test_cutmix_box_size_and_placement_non_square():
    h, w, n = 7, 13, 400
    params = params_for("cutmix", n, h, w, alpha=1.0, seed=3)
    ratio = torch.sqrt(1 - params.lam_drawn)
    height, width = torch.floor(h * ratio).long(), torch.floor(w * ratio).long()  # truncation
    y0, y1, x0, x1 = params.boxes.unbind(1)
    assert ((y1 - y0) <= height).all() and ((x1 - x0) <= width).all()
    not_clipped = (y0 > 0) & (y1 < h) & (x0 > 0) & (x1 < w)
    assert not_clipped.sum() > 20
    assert torch.equal((y1 - y0)[not_clipped], height[not_clipped])
    assert torch.equal((x1 - x0)[not_clipped], width[not_clipped])
    area = (y1 - y0) * (x1 - x0)
    assert (area <= height * width).all()
    assert (area < height * width).any()  # near the border the box shrinks, and so does its label share:
    assert torch.equal(params.lam, 1 - area.double() / (h * w))
    # odd sizes happen (torchvision's boxes are always even before clipping)
    assert ((y1 - y0)[not_clipped] % 2 == 1).any()


def test_cutmix_boxes_formula_by_hand():
    lam = torch.tensor([0.75, 0.0, 1.0], dtype=torch.float64)  # ratio 0.5, 1, 0
    boxes = A.cutmix_boxes(lam, torch.tensor([5, 0, 3]), torch.tensor([9, 19, 4]), 10, 20)
    # h = floor(10 * 0.5) = 5 rows from 5 - 2 = 3; w = 10 columns from 9 - 5 = 4
    assert boxes[0].tolist() == [3, 8, 4, 14]
    # full-size box centred on the corner: clipped to the bottom-right quarter
    assert boxes[1].tolist() == [0, 5, 9, 20]
    assert boxes[2].tolist() == [3, 3, 4, 4]  # lam = 1: empty box
    assert A.box_label_weight(boxes, 10, 20).tolist() == [1 - 50 / 200, 1 - 55 / 200, 1.0]


def test_batch_of_one_mixes_with_itself():
    images = torch.rand(1, 3, 5, 8)
    for kind in ("mixup", "cutmix"):
        params = params_for(kind, 1, 5, 8, seed=1)
        assert params.perm.tolist() == [0]
        out, soft = APPLY[kind][1](images, torch.tensor([2]), params, num_classes=4)
        torch.testing.assert_close(out, images)
        torch.testing.assert_close(soft, F.one_hot(torch.tensor([2]), 4).float())


def test_empty_batch_is_a_clear_error():
    with pytest.raises(ValueError, match="empty batch"):
        A.sample_mix_params(0, 1.0)
    params = MixParams(lam=torch.zeros(0, dtype=torch.float64), perm=torch.zeros(0, dtype=torch.long))
    with pytest.raises(ValueError, match="empty batch"):
        A.mixup(torch.zeros(0, 3, 4, 4), torch.zeros(0, dtype=torch.long), params, num_classes=3)


@pytest.mark.parametrize("kind", ["mixup", "cutmix"])
@pytest.mark.parametrize("labels", ["int", "soft"])
def test_mixed_targets_sum_to_one(kind, labels):
    b, k = 9, 5
    gen = torch.Generator().manual_seed(4)
    targets = torch.randint(k, (b,), generator=gen)
    if labels == "soft":
        targets = torch.softmax(torch.randn(b, k, generator=gen), dim=1)
    params = params_for(kind, b, 6, 10, seed=5)
    for fn in APPLY[kind]:
        _, soft = fn(torch.rand(b, 3, 6, 10), targets, params, num_classes=k)
        assert soft.shape == (b, k) and soft.dtype == torch.float32
        torch.testing.assert_close(soft.sum(1), torch.ones(b))
        assert (soft >= 0).all()


def test_partners_form_a_single_cycle():
    gen = torch.Generator().manual_seed(0)
    for b in (2, 3, 10, 64):
        perm = A.random_partners(b, generator=gen)
        assert sorted(perm.tolist()) == list(range(b))
        i, seen = 0, set()
        while i not in seen:
            seen.add(i)
            i = perm[i].item()
        assert len(seen) == b  # one cycle through everybody: nobody is its own partner


# --------------------------------------------------------------------------------------------------
# Loop == batched, memory format, dtype, in place
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["mixup", "cutmix"])
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_loop_and_batched_agree(kind, channels_last, dtype):
    b, h, w = 7, 6, 11
    images = torch.rand(b, 3, h, w, generator=torch.Generator().manual_seed(1)).to(dtype)
    if channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    labels = torch.randint(4, (b,), generator=torch.Generator().manual_seed(2))
    before = images.clone()
    params = params_for(kind, b, h, w, alpha=0.7, seed=6)
    loop, batched = APPLY[kind]
    out_loop, t_loop = loop(images, labels, params, num_classes=4)
    out, t = batched(images, labels, params, num_classes=4)
    assert torch.equal(out, out_loop) and torch.equal(t, t_loop)  # same arithmetic, bit for bit
    assert out.dtype == dtype and out.shape == images.shape
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    assert out.is_contiguous(memory_format=fmt) and out_loop.is_contiguous(memory_format=fmt)
    assert out.is_contiguous() is (not channels_last)
    assert torch.equal(images, before)  # inputs untouched
    assert not torch.equal(out, images)


@pytest.mark.parametrize("kind", ["mixup", "cutmix"])
@pytest.mark.parametrize("impl", [0, 1], ids=["loop", "batched"])
def test_inplace_writes_into_the_input(kind, impl):
    b, h, w = 5, 4, 9
    images = torch.rand(b, 3, h, w).contiguous(memory_format=torch.channels_last)
    params = params_for(kind, b, h, w, seed=7)
    fn = APPLY[kind][impl]
    expected, _ = fn(images, torch.arange(b), params, num_classes=b)
    out, _ = fn(images, torch.arange(b), params, num_classes=b, inplace=True)
    assert out.data_ptr() == images.data_ptr()
    assert torch.equal(images, expected)  # partners read before being overwritten


def test_mixup_formula_per_sample():
    b = 4
    images = constant_batch(b, 1, 2, 3)
    params = MixParams(lam=torch.tensor([0.25, 0.5, 1.0, 0.0], dtype=torch.float64), perm=torch.tensor([1, 2, 3, 0]))
    out, soft = A.mixup(images, torch.arange(b), params, num_classes=b)
    # x_i' = lam_i (i + 1) + (1 - lam_i) (perm_i + 1)
    assert out[:, 0, 0, 0].tolist() == [0.25 * 1 + 0.75 * 2, 0.5 * 2 + 0.5 * 3, 3.0, 1.0]
    assert soft[0].tolist() == [0.25, 0.75, 0.0, 0.0]


@FAST
@given(b=st.integers(1, 9), h=st.integers(1, 13), w=st.integers(1, 13), seed=st.integers(0, 2**31 - 1),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.uint8]),
       channels_last=st.booleans(), soft_labels=st.booleans(), inplace=st.booleans())
def test_cutmix_equals_the_loop_on_odd_shapes(b, h, w, seed, dtype, channels_last, soft_labels, inplace):
    """Bit for bit, whatever the shape (H != W either way, 1-pixel sides), dtype, layout and labels."""
    gen = torch.Generator().manual_seed(seed)
    images = (torch.rand(b, 3, h, w, generator=gen) * 255).to(dtype)
    if channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    k = 5
    labels = torch.randint(k, (b,), generator=gen)
    if soft_labels:
        labels = torch.softmax(torch.randn(b, k, generator=gen), dim=1)
    params = params_for("cutmix", b, h, w, alpha=0.8, seed=seed)
    out_loop, t_loop = A.cutmix_reference(images.clone(), labels, params, num_classes=k, inplace=inplace)
    given_images = images.clone()
    out, t = A.cutmix(given_images, labels, params, num_classes=k, inplace=inplace)
    assert torch.equal(out, out_loop) and torch.equal(t, t_loop)
    assert out.dtype == dtype and t.dtype == t_loop.dtype
    assert out.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    assert (out.data_ptr() == given_images.data_ptr()) is inplace


def test_cutmix_mask_equals_the_boxes_drawn_by_hand():
    """Empty boxes, whole-image boxes, one-pixel boxes, boxes touching each border, H != W both ways."""
    for h, w in ((5, 9), (9, 5), (1, 7), (6, 1), (1, 1)):
        boxes = [[0, 0, 0, 0], [0, h, 0, w], [h - 1, h, w - 1, w], [0, 1, 0, 1], [h // 2, h // 2, 0, w],
                 [0, h, w // 2, w // 2 + 1], [1 % h, h, 0, (w + 1) // 2]]
        mask = A.cutmix_mask(torch.tensor(boxes), h, w)
        assert mask.shape == (len(boxes), 1, h, w) and mask.dtype == torch.bool
        for i, (y0, y1, x0, x1) in enumerate(boxes):
            expected = torch.zeros(h, w, dtype=torch.bool)
            expected[y0:y1, x0:x1] = True
            assert torch.equal(mask[i, 0], expected), (h, w, boxes[i])


def test_cutmix_label_weight_is_the_clipped_area_and_same_class_pairs_round_once():
    """The labels use params.lam (the clipped box's area), not the drawn lam; a pair of the same class gets
    lam + (1 - lam) rounded once in float32, exactly as the one-hot formula of the loop."""
    b, h, w = 64, 8, 8
    params = params_for("cutmix", b, h, w, alpha=1.0, seed=11)
    assert not torch.equal(params.lam, params.lam_drawn)  # boxes were clipped / rounded: the two differ
    images = torch.rand(b, 1, h, w)
    same = torch.zeros(b, dtype=torch.long)  # everybody class 0: each image's two weights land on one class
    _, t_loop = A.cutmix_reference(images, same, params, num_classes=3)
    _, t = A.cutmix(images, same, params, num_classes=3)
    assert torch.equal(t, t_loop)
    own, other = A.mix_weights(params.lam, torch.float32, "cpu")
    assert torch.equal(t[:, 0], own + other) and (t[:, 1:] == 0).all()
    labels = torch.arange(b)  # one class per image: image i's own weight is t[i, i]
    _, t = A.cutmix(images, labels, params, num_classes=b)
    assert torch.equal(t.diagonal(), params.lam.float())  # the weight of the pasted area


# --------------------------------------------------------------------------------------------------
# What one batched call costs: operations counted, no host-device synchronisation
# --------------------------------------------------------------------------------------------------

class CountOps(TorchDispatchMode):
    """Records every aten operation run inside it: its name, whether it only makes a view, and the largest
    number of elements it writes (a new tensor or one modified in place; -1 when it returns no tensor, such
    as ``promote_types``)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, bool, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        aliases = [r.alias_info for r in func._schema.returns]
        view = bool(aliases) and all(a is not None and not a.is_write for a in aliases)
        written = [t.numel() for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        self.ops.append((func.overloadpacket.__name__, view, max(written, default=-1)))
        return out

    def kernels(self) -> list[str]:
        """The operations that compute a tensor (each is a kernel launch on a GPU)."""
        return [name for name, view, n in self.ops if not view and n >= 0]

    def full_passes(self, numel: int) -> list[str]:
        """The operations that write a tensor as large as the images."""
        return [name for name, view, n in self.ops if not view and n >= numel]


def count_ops(kind, b, h=5, w=7, *, dtype=torch.float32, channels_last=False, soft_labels=False,
              inplace=False, device="cpu"):
    gen = torch.Generator().manual_seed(b)
    images = torch.rand(b, 3, h, w, generator=gen).to(dtype)
    if channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    labels = torch.randint(4, (b,), generator=gen)
    if soft_labels:
        labels = torch.softmax(torch.randn(b, 4, generator=gen), dim=1)
    params = params_for(kind, b, h, w, seed=b).to(device)
    images, labels = images.to(device), labels.to(device)
    with CountOps() as counter:
        APPLY[kind][1](images, labels, params, num_classes=4, inplace=inplace)
    return counter, images.numel()


SYNCING_OPS = {"_local_scalar_dense", "item", "nonzero", "nonzero_static", "masked_select", "unique", "_unique2",
               "is_nonzero", "equal", "allclose"}


@pytest.mark.parametrize("kind", ["mixup", "cutmix"])
@pytest.mark.parametrize("soft_labels", [False, True], ids=["int_labels", "soft_labels"])
def test_batched_call_runs_the_same_operations_whatever_the_batch_size(kind, soft_labels):
    """No loop over the images: 1 image or 37, the same operations in the same order; none that reads a
    value back on the host (on a GPU, a synchronisation)."""
    ops = {b: count_ops(kind, b, soft_labels=soft_labels)[0].ops for b in (1, 2, 37)}
    names = {b: [name for name, _, _ in o] for b, o in ops.items()}
    assert names[1] == names[2] == names[37]
    assert not SYNCING_OPS & set(names[37]), names[37]


@pytest.mark.parametrize("kind", ["mixup", "cutmix"])
@pytest.mark.parametrize("soft_labels", [False, True], ids=["int_labels", "soft_labels"])
@pytest.mark.parametrize("inplace", [False, True], ids=["out", "inplace"])
def test_batched_call_never_reads_data_on_the_host(kind, soft_labels, inplace):
    """On the meta device tensors have shapes but no data: ``.item()``, ``.tolist()``, ``nonzero`` or a
    boolean index fail there. The batched call runs; the loop, which reads the boxes and partners, does not."""
    counter, numel = count_ops(kind, 6, soft_labels=soft_labels, inplace=inplace, device="meta")
    assert counter.full_passes(numel)
    params = params_for(kind, 6, 5, 7).to("meta")
    with pytest.raises((NotImplementedError, RuntimeError)):
        APPLY[kind][0](torch.rand(6, 3, 5, 7, device="meta"), torch.zeros(6, dtype=torch.long, device="meta"),
                       params, num_classes=4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize("inplace", [False, True], ids=["out", "inplace"])
def test_batched_cutmix_costs_two_passes_over_the_images_and_few_kernels(dtype, channels_last, inplace):
    """Gather the partners, select with the mask: two operations as large as the batch, in any dtype and
    either layout (no conversion, no copy back to channels_last, no copy into the input in place). About
    ten small operations besides, whatever the batch size: on a GPU, where a batch of 256 small images is a
    few microseconds of work per kernel, the launches are what a call costs (the direct mask, a one-hot
    encoding and the separate weights were 21 kernels on a GPU, 24 counted here, where ``F.one_hot`` also
    reads the labels' range; the loop runs 6 per image)."""
    counter, numel = count_ops("cutmix", 37, dtype=dtype, channels_last=channels_last, inplace=inplace)
    assert counter.full_passes(numel) == ["index_select", "where"], counter.full_passes(numel)
    assert len(counter.kernels()) <= 14, counter.kernels()  # 13


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
def test_batched_mixup_passes_do_not_depend_on_the_layout(channels_last):
    """float32 MixUp: gather, two products, a sum; channels_last costs no extra copy."""
    counter, numel = count_ops("mixup", 37, channels_last=channels_last)
    assert len(counter.full_passes(numel)) == 4, counter.full_passes(numel)
    assert len(counter.kernels()) <= 12, counter.kernels()  # 11; were 17 (weights computed twice, one-hot)


# --------------------------------------------------------------------------------------------------
# alpha, sampling, reproducibility
# --------------------------------------------------------------------------------------------------

def test_tiny_alpha_puts_lambda_near_zero_or_one():
    lam = A.sample_beta(1e-3, 4000, generator=torch.Generator().manual_seed(0))
    assert not lam.isnan().any()
    assert ((lam < 0.01) | (lam > 0.99)).double().mean() > 0.98  # torch.distributions.Beta: ~25% at exactly 0.5
    assert 0.4 < (lam < 0.5).double().mean() < 0.6


def test_alpha_one_is_uniform_and_large_alpha_concentrates():
    gen = torch.Generator().manual_seed(1)
    uniform = A.sample_beta(1.0, 4000, generator=gen).numpy()
    grid = np.linspace(0, 1, 4001)
    assert np.abs(np.searchsorted(np.sort(uniform), grid, side="right") / 4000 - grid).max() < 0.03
    large = A.sample_beta(1000.0, 4000, generator=gen)
    assert abs(large.mean().item() - 0.5) < 0.002 and large.std().item() < 0.02
    moderate = A.sample_beta(0.2, 8000, generator=gen)
    assert abs(moderate.var().item() - 1 / (4 * (2 * 0.2 + 1))) < 0.01  # Var Beta(a, a) = 1 / (4 (2a + 1))


@pytest.mark.parametrize("alpha", [0, -1.0, float("nan"), float("inf"), None, "1", True])
def test_bad_alpha_raises_one_clear_line(alpha):
    with pytest.raises(ValueError, match=r"alpha must be > 0.*to disable MixUp do not apply it") as err:
        A.sample_mix_params(4, alpha, kind="mixup")
    assert "\n" not in str(err.value)
    if alpha is not None:
        with pytest.raises(ValueError, match="CutMix"):
            MixCutMix(10, mixup_alpha=None, cutmix_alpha=alpha)


def test_other_argument_errors():
    with pytest.raises(ValueError, match="height"):
        A.sample_mix_params(4, 1.0, kind="cutmix")
    with pytest.raises(ValueError, match="kind"):
        A.sample_mix_params(4, 1.0, kind="mixcut")
    with pytest.raises(ValueError, match="num_classes"):
        A.mixup(torch.rand(2, 3, 4, 4), torch.tensor([0, 1]), params_for("mixup", 2, 4, 4))
    with pytest.raises(ValueError, match="batch sizes differ"):
        A.mixup(torch.rand(3, 3, 4, 4), torch.tensor([0, 1, 1]), params_for("mixup", 2, 4, 4), num_classes=2)
    with pytest.raises(ValueError, match="boxes"):
        A.cutmix(torch.rand(2, 3, 4, 4), torch.tensor([0, 1]), params_for("mixup", 2, 4, 4), num_classes=2)
    with pytest.raises(ValueError, match="both are None"):
        MixCutMix(10, mixup_alpha=None, cutmix_alpha=None)


@pytest.mark.parametrize("kind", ["mixup", "cutmix"])
def test_reproducible_with_a_seeded_generator_and_global_rng_untouched(kind):
    state = torch.get_rng_state()
    a, b, c = (params_for(kind, 16, 9, 12, seed=s) for s in (42, 42, 43))
    assert torch.equal(torch.get_rng_state(), state)
    for name in ("lam", "perm", "boxes", "lam_drawn"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None and y is None) or torch.equal(x, y)
    assert not torch.equal(a.lam, c.lam)


@pytest.mark.parametrize("kind", ["mixup", "cutmix"])
def test_per_sample_false_shares_one_draw(kind):
    shared = params_for(kind, 12, 8, 8, seed=0, per_sample=False)
    assert shared.lam.unique().numel() == 1
    if kind == "cutmix":
        assert (shared.boxes == shared.boxes[0]).all()
    assert params_for(kind, 12, 8, 8, seed=0).lam.unique().numel() > 1


def test_mixcutmix_switches_and_reproduces():
    images, labels = torch.rand(6, 3, 8, 10), torch.randint(5, (6,))
    only_cut = MixCutMix(5, switch_prob=1.0, generator=torch.Generator().manual_seed(0))
    only_mix = MixCutMix(5, switch_prob=0.0, generator=torch.Generator().manual_seed(0))
    for mix, kind in ((only_cut, "cutmix"), (only_mix, "mixup")):
        out, soft = mix(images, labels)
        assert mix.last_params.kind == kind and out.shape == images.shape
        torch.testing.assert_close(soft.sum(1), torch.ones(6))
    assert MixCutMix(5, mixup_alpha=None)._pick_kind() == "cutmix"
    assert MixCutMix(5, cutmix_alpha=None)._pick_kind() == "mixup"
    both = [MixCutMix(5, generator=torch.Generator().manual_seed(3)) for _ in range(2)]
    runs = [[m(images, labels) for _ in range(8)] for m in both]
    for (x1, t1), (x2, t2) in zip(*runs):
        assert torch.equal(x1, x2) and torch.equal(t1, t2)
    kinds = set()
    for _ in range(20):
        both[0](images, labels)
        kinds.add(both[0].last_params.kind)
    assert kinds == {"mixup", "cutmix"}


# --------------------------------------------------------------------------------------------------
# torchvision.transforms.v2.MixUp / CutMix
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("kind", ["mixup", "cutmix"])
def test_equals_torchvision_given_the_same_draw(kind, seed):
    """torchvision: one lam per batch, partner = batch.roll(1, 0), i.e. perm[i] = i - 1. Their draws come from
    the global RNG in ``make_params``: re-seeding and calling it again gives the lam / box they used."""
    from torchvision.transforms import v2

    b, h, w, k = 6, 13, 21, 5
    gen = torch.Generator().manual_seed(seed)
    images, labels = torch.rand(b, 3, h, w, generator=gen), torch.randint(k, (b,), generator=gen)
    theirs = (v2.MixUp if kind == "mixup" else v2.CutMix)(alpha=0.5, num_classes=k)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        tv_images, tv_labels = theirs(images, labels)
        torch.manual_seed(seed)
        drawn = theirs.make_params([images])
    roll = torch.arange(b).roll(1)
    assert roll.tolist() == [b - 1, *range(b - 1)]
    if kind == "mixup":
        params = MixParams(lam=torch.full((b,), drawn["lam"], dtype=torch.float64), perm=roll)
    else:
        x1, y1, x2, y2 = drawn["box"]  # torchvision: (x1, y1, x2, y2); ours: (y0, y1, x0, x1)
        params = A.cutmix_params(torch.tensor([[y1, y2, x1, x2]] * b), roll, h, w)
        assert params.lam[0].item() == drawn["lam_adjusted"]
    for fn in APPLY[kind]:
        out, soft = fn(images, labels, params, num_classes=k)
        assert torch.equal(out, tv_images) and torch.equal(soft, tv_labels)


def _torchvision_box(lam: float, r_y: int, r_x: int, h: int, w: int) -> list[int]:
    """torchvision 0.28's CutMix box (transforms/v2/_augment.py), as (y0, y1, x0, x1)."""
    r = 0.5 * math.sqrt(1.0 - lam)
    r_h_half, r_w_half = int(r * h), int(r * w)
    return [max(r_y - r_h_half, 0), min(r_y + r_h_half, h), max(r_x - r_w_half, 0), min(r_x + r_w_half, w)]


def test_box_formula_difference_with_torchvision():
    """Same lam and centre: our unclipped box is floor(r H) rows, theirs 2 floor(r H / 2): equal when floor(r H)
    is even, one row more for us when it is odd."""
    h, w = 31, 17
    lam = A.sample_beta(1.0, 300, generator=torch.Generator().manual_seed(0))
    cy, cx = torch.full((300,), h // 2), torch.full((300,), w // 2)
    ours = A.cutmix_boxes(lam, cy, cx, h, w)
    for i in range(300):
        theirs = _torchvision_box(lam[i].item(), h // 2, w // 2, h, w)
        rows = math.floor(h * math.sqrt(1 - lam[i].item()))
        if rows % 2 == 0:
            assert ours[i, :2].tolist() == theirs[:2]
        else:
            assert ours[i, 1] - ours[i, 0] == theirs[1] - theirs[0] + 1


@pytest.mark.parametrize("kind, alpha, size", [("mixup", 0.2, (32, 32)), ("cutmix", 1.0, (224, 224)),
                                               ("cutmix", 0.3, (96, 160))])
def test_lambda_distribution_matches_torchvision(kind, alpha, size):
    """per_sample=False draws one lam per batch, as torchvision does: same distribution of the mixing weight
    (MixUp) and of the area-based label weight (CutMix; at realistic sizes, where the one-pixel box
    difference is negligible). Seeded, hence deterministic; KS 1% critical value for n = m = 1500 is 0.06."""
    from torchvision.transforms import v2

    n, (h, w) = 1500, size
    key = "lam" if kind == "mixup" else "lam_adjusted"
    theirs_t = (v2.MixUp if kind == "mixup" else v2.CutMix)(alpha=alpha, num_classes=10)
    probe = torch.empty(2, 3, h, w)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        theirs = [theirs_t.make_params([probe])[key] for _ in range(n)]
    gen = torch.Generator().manual_seed(0)
    ours = [A.sample_mix_params(2, alpha, kind=kind, height=h, width=w, per_sample=False, generator=gen).lam[0].item()
            for _ in range(n)]
    assert ks_statistic(ours, theirs) < 0.06
    assert abs(np.mean(ours) - np.mean(theirs)) < 0.03
    assert np.abs(np.quantile(ours, [0.1, 0.5, 0.9]) - np.quantile(theirs, [0.1, 0.5, 0.9])).max() < 0.05


# --------------------------------------------------------------------------------------------------
# Loss and accuracy with soft targets
# --------------------------------------------------------------------------------------------------

def test_soft_cross_entropy_equals_torch_cross_entropy():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(8, 6, generator=gen)
    probs = torch.softmax(torch.randn(8, 6, generator=gen), 1)
    torch.testing.assert_close(A.soft_cross_entropy(logits, probs), F.cross_entropy(logits, probs))
    labels = torch.randint(6, (8,), generator=gen)
    torch.testing.assert_close(A.soft_cross_entropy(logits, labels), F.cross_entropy(logits, labels))
    torch.testing.assert_close(A.soft_cross_entropy(logits, F.one_hot(labels, 6).float()),
                               F.cross_entropy(logits, labels))
    # with mixed targets it is the mixture of the two cross-entropies
    a, b, lam = labels, labels.roll(1), 0.3
    mixed = lam * F.one_hot(a, 6).float() + (1 - lam) * F.one_hot(b, 6).float()
    torch.testing.assert_close(A.soft_cross_entropy(logits, mixed),
                               lam * F.cross_entropy(logits, a) + (1 - lam) * F.cross_entropy(logits, b))


def test_soft_accuracy_on_a_constructed_example():
    logits = torch.tensor([[5.0, 0.0, 0.0], [0.0, 5.0, 0.0], [0.0, 0.0, 5.0]])  # predicts 0, 1, 2
    soft = torch.tensor([[0.7, 0.3, 0.0],   # predicts the 0.7 class -> 0.7
                         [0.6, 0.0, 0.4],   # predicts a class absent from the mix -> 0
                         [0.0, 0.2, 0.8]])  # -> 0.8
    assert A.soft_accuracy(logits, soft).item() == pytest.approx(1.5 / 3)
    labels = torch.tensor([0, 2, 2])
    assert A.soft_accuracy(logits, labels).item() == pytest.approx(2 / 3)
    assert A.soft_accuracy(logits, F.one_hot(labels, 3).float()).item() == pytest.approx(2 / 3)
    # the naive formula broadcasts [B] against [B, K] and compares class indices with probabilities
    naive = logits.argmax(1) == soft
    assert naive.shape == (3, 3)  # a table of "prediction of sample k == probability soft[i, k]"
    assert naive.float().mean().item() == pytest.approx(1 / 9)  # one 0.0 == class 0 by chance: meaningless


# --------------------------------------------------------------------------------------------------
# Benchmark and command line
# --------------------------------------------------------------------------------------------------

def test_benchmark_records():
    records = mixing.benchmark(batch_size=4, image_size=8, device="cpu", repeats=2, warmup=0)
    assert [(r["kind"], r["implementation"]) for r in records] == [
        ("mixup", "loop"), ("mixup", "batched"), ("cutmix", "loop"), ("cutmix", "batched")]
    for r in records:
        assert r["images_per_s"] > 0 and r["device"] == "cpu" and r["speedup"] > 0
        assert r["speedup"] == 1.0 or r["implementation"] == "batched"
        assert len(r["measurement"]["times_s"]) == 2 and r["measurement"]["items_per_call"] == 4
    assert "batched" in mixing.format_table(records)
    # every record keeps its timed calls, so that a sentence can say whether the speed-up is beyond the noise
    from dlo.measure import check_conclusions, conclude

    results: dict = {}
    said = conclude(results, records[1]["measurement"], records[0]["measurement"])
    assert "mixup batched (cpu)" in said and "mixup loop (cpu)" in said and check_conclusions(results) == []


def test_benchmark_interleaves_the_loop_and_the_batched_kernel(monkeypatch):
    order = []
    real = mixing.measure_interleaved

    def spy(candidates, **kwargs):
        order.append(list(candidates))
        return real(candidates, **kwargs)

    monkeypatch.setattr(mixing, "measure_interleaved", spy)
    mixing.benchmark(batch_size=4, image_size=8, device="cpu", repeats=2, warmup=0, kinds=("cutmix",))
    assert order == [["cutmix loop (cpu)", "cutmix batched (cpu)"]]  # timed together, A B A B


def test_command_line_writes_json(tmp_path):
    out = tmp_path / "aug.json"
    cmd = [sys.executable, "-m", "dlo", "mix-bench", "--device", "cpu", "--batch-size", "8", "--repeats", "2",
           "--image-size", "8", "--out", str(out)]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "speed-up" in res.stdout and "cutmix" in res.stdout
    payload = json.loads(out.read_text())
    assert payload["environment"]["torch"] == torch.__version__ and "gpu" in payload["environment"]
    assert len(payload["records"]) == 4 and payload["config"]["batch_size"] == 8


def test_command_line_errors_are_one_line(capsys):
    assert mixing.main(["--device", "cpu", "--batch-size", "0"]) == 2
    assert "error: argument --batch-size: must be >= 1, got 0" in capsys.readouterr().err
