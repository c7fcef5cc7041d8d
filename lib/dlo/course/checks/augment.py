"""Checkers of Jour2/augment.ipynb (course ``augment``): the CutMix box, batched MixUp and CutMix, accuracy on mixed
labels."""
from __future__ import annotations

import os
from typing import Callable

import dlo
from dlo.course.checks.framework import CheckFailed, expect, register
from dlo.data import augment
from dlo.course.checks.augment_cases import (ACCURACY_MISTAKES, BOX_MISTAKES, accuracy_cases, accuracy_reference,
                                             accuracy_same, box_cases, box_reference, box_same, mixup_cases)
from dlo.course.checks.augment_mixup import check_mixup_cases
from dlo.course.checks.cases import judge
from dlo.data.augment import cutmix_reference, random_partners, sample_beta, sample_mix_params

AUGMENT_NB = "Jour2/augment.ipynb"


BOX_CASES, MIXUP_CASES, ACCURACY_CASES = box_cases(), mixup_cases(), accuracy_cases()


@register("augment", "box", ("cutmix_box",), AUGMENT_NB)
def _check_box(cutmix_box: Callable) -> str:
    tried = judge(BOX_CASES, lambda lam, cy, cx, height, width: cutmix_box(lam, cy, cx, height, width),
                  box_reference, BOX_MISTAKES, same=box_same)
    return (f"{tried} boxes identical to dlo.data.augment.cutmix_boxes (sizes from sqrt(1 - lam), clipped; lam 0 and "
            "1, one-row images, sides on a whole pixel)")


@register("augment", "mixup", ("mixup_batch",), AUGMENT_NB)
def _check_mixup(mixup_batch: Callable) -> str:
    tried = check_mixup_cases(mixup_batch, MIXUP_CASES)
    return (f"batched MixUp equals the per-image loop on {tried} batches (batch of 1, odd sides, float32/64, bfloat16, "
            "float16, channels_last, lam 0 and 1), values and gradients; inputs untouched, the images' dtype kept")


@register("augment", "accuracy", ("mixed_accuracy",), AUGMENT_NB)
def _check_accuracy(mixed_accuracy: Callable) -> str:
    tried = judge(ACCURACY_CASES, lambda logits, targets: mixed_accuracy(logits, targets), accuracy_reference,
                  ACCURACY_MISTAKES, same=accuracy_same)
    return (f"hard labels: usual accuracy; soft labels: each prediction scores its class's weight ({tried} batches, "
            "float32/64, bfloat16, float16 labels, ties, a batch of 1)")


def _box_variant(lam, cy, cx, height: int, width: int, *, swap: bool = False,
                 rounding: str = "floor", clip: bool = True):
    """Boxes ``[B, 4]`` computed like :func:`cutmix_boxes`, or with one known mistake (to name it)."""
    import torch

    ratio = torch.sqrt(1.0 - lam.to(torch.float64))
    side_h, side_w = (width, height) if swap else (height, width)
    rnd = torch.floor if rounding == "floor" else torch.round
    h, w = rnd(side_h * ratio).long(), rnd(side_w * ratio).long()
    y0, x0 = cy - h // 2, cx - w // 2
    if not clip:
        return torch.stack([y0, y0 + h, x0, x0 + w], dim=1)
    return torch.stack([y0.clamp(0, height), (y0 + h).clamp(0, height), x0.clamp(0, width), (x0 + w).clamp(0, width)],
                       dim=1)


def _paste(images, perm, boxes, *, inverted: bool = False, closed: bool = False):
    """The images with each box filled by the partner's pixels (the mask built like the lesson's), or a mistake."""
    import torch

    height, width = images.shape[-2:]
    rows = torch.arange(height).view(1, height, 1)
    cols = torch.arange(width).view(1, 1, width)
    y0, y1, x0, x1 = (b.view(-1, 1, 1) for b in boxes.unbind(1))
    if closed:
        inside = (rows >= y0) & (rows <= y1) & (cols >= x0) & (cols <= x1)
    else:
        inside = (rows >= y0) & (rows < y1) & (cols >= x0) & (cols < x1)
    inside = inside[:, None]
    partners = images[perm]
    return torch.where(inside, images, partners) if inverted else torch.where(inside, partners, images)


def _mix_soft(targets, perm, own):
    import torch

    own = own.to(torch.float64)[:, None]
    t = targets.to(torch.float64)
    return own * t + (1 - own) * t[perm]


class _Counting:
    """Counts, while active, the torch operations called (a TorchFunctionMode) and the Python lines run in the
    student's code (sys.settrace; any file outside Python's, torch's, the installed packages' and this package's):
    a loop over the samples makes one or the other grow with the batch size, even through a helper of another cell."""

    def __init__(self) -> None:
        import sysconfig

        import torch

        paths = sysconfig.get_paths()
        self.library = tuple(str(p) for p in {paths["stdlib"], paths["purelib"], paths["platlib"],
                                              os.path.dirname(torch.__file__), os.path.dirname(dlo.__file__)})
        self.ops, self.lines = 0, 0

    def __enter__(self) -> "_Counting":
        import sys

        from torch.overrides import TorchFunctionMode

        counter = self

        class Mode(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                counter.ops += 1
                return func(*args, **(kwargs or {}))

        def local(frame, event, arg):
            if event == "line":
                counter.lines += 1
            return local

        def tracer(frame, event, arg):
            name = frame.f_code.co_filename
            return None if name.startswith(counter.library) or name.startswith("<frozen") else local

        self._old_trace = sys.gettrace()
        self._mode = Mode()
        self._mode.__enter__()
        sys.settrace(tracer)
        return self

    def __exit__(self, *exc) -> None:
        import sys

        sys.settrace(self._old_trace)
        self._mode.__exit__(*exc)


class _NoLibraryCutMix:
    """While active, the library's CutMix functions refuse to run: the exercise is to write them."""

    NAMES = ("cutmix", "cutmix_reference", "cutmix_mask", "cutmix_boxes", "cutmix_params", "box_label_weight",
             "sample_mix_params", "MixCutMix")

    def __enter__(self) -> None:
        self._saved = {name: getattr(augment, name) for name in self.NAMES}

        def refuse(*args, **kwargs):
            raise CheckFailed("build the boxes, the mask and the label weights yourself: aug.cutmix (and its helpers) "
                              "is the answer you are compared with")

        for name in self.NAMES:
            setattr(augment, name, refuse)

    def __exit__(self, *exc) -> None:
        for name, value in self._saved.items():
            setattr(augment, name, value)


def _call_cutmix(cutmix_batch: Callable, images, targets, alpha: float, seed: int):
    import torch

    with _NoLibraryCutMix():
        out = cutmix_batch(images, targets, alpha, torch.Generator().manual_seed(seed))
    expect(isinstance(out, tuple) and len(out) == 2, "return a tuple (mixed_images, mixed_targets)")
    return out


def _describe_box(diff) -> str:
    """Rows and columns where a sample's pixels changed, as 'rows a:b, cols c:d' (or 'nothing')."""
    import torch

    rows, cols = torch.nonzero(diff.any(0).any(1)).flatten(), torch.nonzero(diff.any(0).any(0)).flatten()
    if len(rows) == 0:
        return "nothing pasted"
    return f"rows {rows.min().item()}:{rows.max().item() + 1}, cols {cols.min().item()}:{cols.max().item() + 1}"


def _cutmix_inputs(b: int, c: int, h: int, w: int, dtype, seed: int):
    """Images of the given dtype and soft targets (as after another mix) for one case."""
    import torch

    g = torch.Generator().manual_seed(100 + seed)
    if dtype == torch.uint8:
        images = torch.randint(0, 256, (b, c, h, w), generator=g, dtype=torch.uint8)
    else:
        images = torch.rand(b, c, h, w, generator=g).to(dtype)
    return images, torch.softmax(3 * torch.randn(b, 5, generator=g), dim=1)


def _explain_cutmix_images(got_x, ref_x, images, params, where: str, seed: int, alpha: float) -> None:
    """The mixed images differ from the reference: name the known mistake, else the first sample that differs."""
    import torch

    b, _, h, w = images.shape
    lam, perm, boxes = params.lam_drawn, params.perm, params.boxes
    cy, cx = _centres(seed, b, h, w, alpha)
    mistakes = [
        (_paste(images, perm, _box_variant(lam, cy, cx, h, w, swap=True)),
         "height and width swapped: the box's height comes from the images' height, its width from their width"),
        (_paste(images, perm, _box_variant(lam, cy, cx, h, w, rounding="round")),
         "the sides are rounded to the nearest pixel: the reference truncates them (floor)"),
        (_paste(images, perm, boxes, inverted=True),
         "the partner's pixels went outside the box: inside the box the image shows its partner, outside its own"),
        (_paste(images, perm, boxes, closed=True),
         "the box is half-open: rows y0 <= y < y1 and columns x0 <= x < x1 (your mask includes row y1 and column x1)"),
        (_paste(images, torch.arange(b), boxes) if b > 1 else None,
         "each image pasted its own pixels, not its partner's (the permutation was not applied)"),
    ]
    for variant, message in mistakes:
        if variant is not None and torch.equal(got_x, variant):
            raise CheckFailed(f"{where}: {message}")
    bad = next(i for i in range(b) if not torch.equal(got_x[i], ref_x[i]))
    y0, y1, x0, x1 = boxes[bad].tolist()
    raise CheckFailed(f"{where}: sample {bad} differs from the per-sample reference aug.cutmix_reference: expected its "
                      f"partner's pixels in rows {y0}:{y1}, cols {x0}:{x1}, yours changed "
                      f"{_describe_box(got_x[bad] != images[bad])}")


def _explain_cutmix_targets(got_t, targets, params, where: str, seed: int, alpha: float, h: int, w: int) -> None:
    """The mixed targets differ from the reference: name the known mistake, else the formula of the weight."""
    import torch

    b = targets.shape[0]
    perm, boxes = params.perm, params.boxes
    area = ((boxes[:, 1] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 2])).double() / (h * w)
    unclipped = _box_variant(params.lam_drawn, *_centres(seed, b, h, w, alpha), h, w, clip=False)
    full = ((unclipped[:, 1] - unclipped[:, 0]) * (unclipped[:, 3] - unclipped[:, 2])).double() / (h * w)
    mistakes = [
        (_mix_soft(targets, perm, params.lam_drawn),
         "the label weights are the drawn lam, not the area really pasted: a box clipped at the border pastes less, "
         "so the weight must come from the clipped box"),
        (_mix_soft(targets, perm, 1 - full),
         "the label weights use the area of the box before clipping: the area must come from the clipped corners"),
        (_mix_soft(targets, perm, area),
         "the weights are swapped: the image keeps what is left of its own label (1 - the pasted fraction), the "
         "partner gets the pasted fraction"),
        (targets.double(), "the targets came out unchanged: the partner's label never gets the pasted fraction "
                           "(mixing a label with itself, without the permutation, leaves it as it was)"),
    ]
    for variant, message in mistakes:
        if b > 1 and torch.allclose(got_t.double(), variant, atol=1e-5):
            raise CheckFailed(f"{where}: {message}")
    raise CheckFailed(f"{where}: the mixed targets differ from the reference: each image's label keeps 1 - a of itself "
                      "and takes a of its partner's, a being the fraction of the image really pasted")


def _check_cutmix_case(cutmix_batch: Callable, b: int, c: int, h: int, w: int, dtype, alpha: float, seed: int) -> None:
    """One batch against the per-sample reference: the inputs untouched, the images exact, the targets close."""
    import torch

    images, targets = _cutmix_inputs(b, c, h, w, dtype, seed)
    before_x, before_t = images.clone(), targets.clone()
    got_x, got_t = _call_cutmix(cutmix_batch, images, targets, alpha, seed)
    expect(torch.equal(images, before_x) and torch.equal(targets, before_t),
           "the inputs were modified in place: build new tensors")
    params = sample_mix_params(b, alpha, kind="cutmix", height=h, width=w,
                               generator=torch.Generator().manual_seed(seed))
    ref_x, ref_t = cutmix_reference(images, targets, params)
    where = f"batch {b} of {h}x{w} {str(dtype).replace('torch.', '')} images"
    expect(isinstance(got_x, torch.Tensor) and got_x.shape == images.shape,
           f"{where}: the mixed images must keep the shape {tuple(images.shape)}, got "
           f"{tuple(got_x.shape) if isinstance(got_x, torch.Tensor) else type(got_x).__name__}")
    expect(got_x.dtype == images.dtype,
           f"{where}: the mixed images must keep the dtype {images.dtype}, got {got_x.dtype}: CutMix copies pixels, "
           "it computes nothing")
    if not torch.equal(got_x, ref_x):
        _explain_cutmix_images(got_x, ref_x, images, params, where, seed, alpha)
    expect(isinstance(got_t, torch.Tensor) and got_t.shape == targets.shape,
           f"{where}: the mixed targets must keep the shape {tuple(targets.shape)}")
    if not torch.allclose(got_t.double(), ref_t.double(), atol=1e-5):
        _explain_cutmix_targets(got_t, targets, params, where, seed, alpha, h, w)


def _check_cutmix_large_batch(cutmix_batch: Callable) -> None:
    """A batch of 512 where sample i is the only one of class i: its label weight is the area pasted, and it costs
    as many operations and lines as a batch of 8 (no Python loop over the samples)."""
    import torch

    counts = {}
    for b in (8, 512):
        h, w = 11, 16
        images = (torch.arange(b, dtype=torch.float32) + 1).view(b, 1, 1, 1).expand(b, 2, h, w).contiguous()
        targets = torch.eye(b)  # sample i is the only one of class i
        with _Counting() as counting:
            got_x, got_t = _call_cutmix(cutmix_batch, images, targets, 1.0, 7)
        counts[b] = (counting.ops, counting.lines)
    from_partner = (got_x[:, 0] != images[:, 0]).double().mean(dim=(1, 2))  # the fraction of each image pasted
    own_weight = got_t.double().diagonal()
    worst = (own_weight - (1 - from_partner)).abs().argmax().item()
    expect(torch.allclose(own_weight, 1 - from_partner, atol=1e-5),
           f"batch of 512: sample {worst} shows {from_partner[worst].item():.1%} of its partner's pixels, but its label "
           f"gives its own class {own_weight[worst].item():.3f} instead of {1 - from_partner[worst].item():.3f}: the "
           "weight must be 1 - (area pasted) / (H * W)")
    extra_ops, extra_lines = counts[512][0] - counts[8][0], counts[512][1] - counts[8][1]
    expect(extra_ops <= 16 and extra_lines <= 16,
           f"a batch of 512 ran {extra_ops} more torch operations and {extra_lines} more lines of your code than a "
           "batch of 8: there is a Python loop over the samples; compare all boxes at once, by broadcasting")


@register("augment", "cutmix_batch", ("cutmix_batch",), AUGMENT_NB)
def _check_cutmix_batch(cutmix_batch: Callable) -> str:
    import torch

    # (batch, channels, height, width, dtype, alpha, seed): non-square images, several dtypes (CutMix copies pixels,
    # so every dtype must come out exact), a batch of one (its own partner)
    cases = [(6, 3, 7, 13, torch.float32, 1.0, 0), (16, 3, 12, 5, torch.bfloat16, 0.4, 1),
             (9, 2, 24, 32, torch.uint8, 2.0, 2), (1, 3, 6, 10, torch.float64, 1.0, 3),
             (12, 1, 13, 7, torch.float16, 0.7, 4), (32, 3, 9, 17, torch.float32, 1.0, 5)]
    for case in cases:
        _check_cutmix_case(cutmix_batch, *case)
    _check_cutmix_large_batch(cutmix_batch)
    return (f"{len(cases)} batches (non-square images, float32/16/64, bfloat16, uint8) equal to the per-sample "
            "reference; label weights = the area pasted; as many operations for 512 samples as for 8")


def _centres(seed: int, b: int, height: int, width: int, alpha: float):
    """The box centres that ``sample_mix_params(b, alpha, kind="cutmix", generator=seeded(seed))`` draws."""
    import torch

    g = torch.Generator().manual_seed(seed)
    random_partners(b, generator=g)
    sample_beta(alpha, b, generator=g)
    return torch.randint(height, (b,), generator=g), torch.randint(width, (b,), generator=g)
