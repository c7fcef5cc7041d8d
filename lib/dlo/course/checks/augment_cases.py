"""Generated cases of the augment checkers for the CutMix box, batched MixUp and accuracy on mixed labels.

- box: :func:`dlo.data.augment.cutmix_boxes` (float64) on 200 drawn boxes plus fixed ones: lam at 0 and 1, images of
  one row or column, odd sides, centres on the borders, and lams whose side lands exactly on a whole pixel (where a
  ratio computed in float32 truncates to the pixel below). Two empty boxes are the same box.
- mixup: :func:`dlo.data.augment.mixup_reference` on batches of 1 to 6, odd image sides, float32, float64, bfloat16
  and float16 images (channels_last too), one-hot and soft targets, lam at 0 and 1 and in between, permutations with
  fixed points; the mixed images and targets, then the gradients of both inputs for a seeded cotangent.
- accuracy: the argmax-then-score definition on hard and soft labels (mixes of two one-hots with lam at 0, 1 and in
  between, and dense soft labels) in float32, float64, bfloat16 and float16, batches of 1 to 37, logits with ties.
  The result is a Python float from an argmax: there is no gradient.
"""
from __future__ import annotations

import math
import random
from typing import Any

import torch

from dlo.course.checks.cases import Case, compare, seeded
from dlo.data.augment import cutmix_boxes

# ------------------------------------------------------------------------------------------------ box


def _box(lam: float, cy: int, cx: int, h: int, w: int) -> Case:
    return Case(f"lam={lam:.6g}, centre ({cy}, {cx}) in a {h}x{w} image",
                {"lam": lam, "cy": cy, "cx": cx, "height": h, "width": w}, size=h * w)


def _draw_box(rng: random.Random) -> Case:
    h, w = rng.randint(2, 47), rng.randint(2, 47)
    return _box(rng.random(), rng.randrange(h), rng.randrange(w), h, w)


def _whole_pixel_boxes() -> list[Case]:
    """lam = 1 - (a / side)^2: side x sqrt(1 - lam) is a whole number a, up to float64's last bit."""
    out = []
    for a, side, other in ((3, 7, 9), (2, 5, 11), (5, 13, 6), (4, 9, 9), (7, 15, 8), (6, 11, 11)):
        out.append(_box(1 - (a / side) ** 2, side // 2, other // 2, side, other))
    return out


def box_cases() -> list[Case]:
    fixed = [_box(0.3, 30, 2, 32, 32), _box(0.0, 16, 16, 32, 32), _box(0.999, 5, 5, 32, 32), _box(0.5, 0, 0, 24, 40),
             _box(1.0, 3, 4, 8, 9), _box(0.0, 0, 0, 5, 7), _box(0.4, 0, 3, 1, 9), _box(0.6, 4, 0, 7, 1),
             _box(0.25, 6, 8, 7, 9), *_whole_pixel_boxes()]
    return seeded(_draw_box, 200, seed=5, fixed=fixed)


def box_reference(lam: float, cy: int, cx: int, height: int, width: int) -> tuple[int, ...]:
    return tuple(int(v) for v in cutmix_boxes(torch.tensor([lam], dtype=torch.float64), torch.tensor([cy]),
                                              torch.tensor([cx]), height, width)[0].tolist())


def box_same(got: Any, want: tuple[int, ...], case: Case) -> str | None:
    if not (isinstance(got, tuple) and len(got) == 4):
        return f"the box is {got!r}, expected a tuple (y0, y1, x0, x1)"
    if not all(hasattr(v, "__index__") and not isinstance(v, bool) for v in got):
        return (f"the box is {got!r}: return Python ints (y0, y1, x0, x1): a float cannot index a slice; math.floor "
                "and // give ints")
    got = tuple(int(v) for v in got)
    empty = lambda b: b[1] <= b[0] or b[3] <= b[2]  # noqa: E731
    if got == want or (empty(got) and empty(want) and min(got) >= 0):
        return None
    kw = case.kwargs
    if min(got) < 0 or got[1] > kw["height"] or got[3] > kw["width"]:
        return f"the box {got} leaves the image: clip it (expected {want})"
    return f"the box is {got}, expected {want}"


# ------------------------------------------------------------------------------------------------ mixup


def _lams(b: int, g: torch.Generator) -> torch.Tensor:
    lam = torch.rand(b, generator=g)
    if b >= 3:
        lam[0], lam[1] = 0.0, 1.0
    return lam


def mixup_case(b: int, c: int, h: int, w: int, dtype: torch.dtype, channels_last: bool, soft: bool, seed: int) -> Case:
    g = torch.Generator().manual_seed(seed)
    images = torch.rand(b, c, h, w, generator=g).to(dtype)
    if channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    k = 5
    targets = (torch.softmax(3 * torch.randn(b, k, generator=g), 1) if soft
               else torch.nn.functional.one_hot(torch.randint(k, (b,), generator=g), k).float())
    perm = torch.randperm(b, generator=g)
    if b >= 4:
        perm[2] = 2  # a fixed point: that image is mixed with itself
    lam = _lams(b, g)
    name = str(dtype).replace("torch.", "")
    label = (f"a batch of {b} {name} images of {c}x{h}x{w}{' (channels_last)' if channels_last else ''}, "
             f"{'soft' if soft else 'one-hot'} targets, lam {[round(v, 3) for v in lam.tolist()]}, "
             f"perm {perm.tolist()}")
    return Case(label, {"images": images, "targets": targets, "lam": lam, "perm": perm}, size=b * c * h * w)


def mixup_cases() -> list[Case]:
    specs = [(6, 3, 5, 7, torch.float32, False, False), (1, 3, 3, 5, torch.float32, False, True),
             (2, 1, 1, 4, torch.float64, False, True), (6, 3, 5, 7, torch.float32, True, True),
             (4, 3, 7, 3, torch.bfloat16, False, False), (5, 2, 9, 9, torch.float16, False, True),
             (3, 3, 4, 6, torch.bfloat16, True, True), (5, 4, 3, 11, torch.float64, True, False)]
    return sorted((mixup_case(*s, seed=20 + i) for i, s in enumerate(specs)), key=lambda c: c.size)


def images_tolerance_dtype(case: Case) -> torch.dtype:
    return case.kwargs["images"].dtype


# ------------------------------------------------------------------------------------------------ accuracy


def _accuracy_case(b: int, k: int, kind: str, dtype: torch.dtype, ties: bool, seed: int) -> Case:
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randint(0, 2, (b, k), generator=g).float() if ties else torch.randn(b, k, generator=g))
    labels = torch.randint(k, (b, 2), generator=g)
    if kind == "hard":
        targets = labels[:, 0]
    elif kind == "dense":
        targets = torch.softmax(2 * torch.randn(b, k, generator=g), 1).to(dtype)
    else:
        lam = torch.rand(b, 1, generator=g)
        if b >= 3:
            lam[0], lam[1] = 0.0, 1.0
        one_hot = torch.nn.functional.one_hot(labels, k).float()
        targets = (lam * one_hot[:, 0] + (1 - lam) * one_hot[:, 1]).to(dtype)
    name = "int64" if kind == "hard" else str(dtype).replace("torch.", "")
    what = {"hard": "integer labels", "dense": "soft labels", "mixed": "mixes of two labels (lam 0 and 1 included)"}
    return Case(f"a batch of {b}, {k} classes, {what[kind]} in {name}{', logits with ties' if ties else ''}",
                {"logits": logits, "targets": targets}, size=b * k)


def accuracy_cases() -> list[Case]:
    fixed = [
        Case("4 images, 3 classes, integer labels",
             {"logits": torch.tensor([[5.0, 0, 0], [0, 5.0, 0], [0, 0, 5.0], [5.0, 0, 0]]),
              "targets": torch.tensor([0, 1, 1, 2])}, size=11.5),
        Case("4 images, 3 classes, soft labels in float32",
             {"logits": torch.tensor([[5.0, 0, 0], [0, 5.0, 0], [0, 0, 5.0], [5.0, 0, 0]]),
              "targets": torch.tensor([[0.7, 0.3, 0.0], [0.0, 0.2, 0.8], [0.0, 0.6, 0.4], [0.5, 0.0, 0.5]])},
             size=11.6)]
    specs = [(1, 3, "hard", torch.float32, False), (1, 4, "mixed", torch.float32, False),
             (5, 2, "mixed", torch.float32, True), (6, 4, "dense", torch.bfloat16, False),
             (7, 5, "mixed", torch.float64, True), (9, 3, "dense", torch.float16, False),
             (37, 7, "mixed", torch.float32, False), (37, 7, "hard", torch.float32, True),
             (16, 10, "mixed", torch.bfloat16, True), (12, 6, "dense", torch.float64, False)]
    return sorted([*fixed, *(_accuracy_case(*s, seed=40 + i) for i, s in enumerate(specs))], key=lambda c: c.size)


def accuracy_reference(logits: torch.Tensor, targets: torch.Tensor) -> float:
    pred = logits.argmax(dim=1)
    if targets.ndim == 1:
        return (pred == targets).double().mean().item()
    return targets.double().gather(1, pred[:, None]).mean().item()


def accuracy_same(got: Any, want: float, case: Case) -> str | None:
    if isinstance(got, torch.Tensor) or not isinstance(got, float):
        return f"the accuracy is a {type(got).__name__}: return a Python float (use .item())"
    t = case.kwargs["targets"]
    low = t.dtype in (torch.bfloat16, torch.float16)  # the labels' own rounding; float32 at least
    return compare(got, want, "the accuracy", dtype=t.dtype if low else torch.float32)


def _soft_only(formula):
    """A known mistake on soft labels (integer labels scored the usual way)."""
    def variant(logits, targets):
        if targets.ndim == 1:
            return accuracy_reference(logits, targets)
        return float(formula(logits, targets.double()))
    return variant


ACCURACY_MISTAKES = (
    (_soft_only(lambda lg, t: t.max(1).values.mean()),
     "you scored each label's largest weight whatever the model predicted: score targets[i, prediction_i]"),
    (_soft_only(lambda lg, t: (torch.softmax(lg.double(), 1) * t).sum(1).mean()),
     "you weighted the targets by the softmax probabilities: score the predicted class only, targets[i, argmax_i]"),
    (_soft_only(lambda lg, t: t.gather(1, lg.argmax(1)[:, None]).mean() / t.shape[1]),
     "you averaged over the B x K entries of the targets: take one weight per image, then the mean over the batch"),
    (_soft_only(lambda lg, t: (lg.argmax(1) == t.argmax(1)).double().mean()),
     "you compared the prediction with the label's largest class: a mixed label gives its weight to several classes, "
     "score targets[i, prediction_i]"),
)


def _box_variant_py(lam: float, cy: int, cx: int, height: int, width: int, **options) -> tuple[int, ...]:
    r = (1.0 - lam) if options.get("area") else math.sqrt(1.0 - lam)
    rnd = options.get("rnd", math.floor)
    h, w = (int(rnd(width * r)), int(rnd(height * r))) if options.get("swap") else (int(rnd(height * r)),
                                                                                     int(rnd(width * r)))
    y0, x0 = (cy, cx) if options.get("corner") else (cy - h // 2, cx - w // 2)
    if options.get("shift"):
        y0, x0 = min(max(y0, 0), height - h), min(max(x0, 0), width - w)
        return y0, y0 + h, x0, x0 + w
    clip = lambda v, hi: min(max(v, 0), hi)  # noqa: E731
    return clip(y0, height), clip(y0 + h, height), clip(x0, width), clip(x0 + w, width)


def _box_mistake(**options):
    return lambda lam, cy, cx, height, width: _box_variant_py(lam, cy, cx, height, width, **options)


BOX_MISTAKES = (
    (_box_mistake(area=True), "each side was scaled by the pasted fraction itself, so the area is that fraction "
                              "squared: a rectangle's area scales with the square of its sides' ratio, so each side "
                              "scales by the fraction's square root"),
    (_box_mistake(swap=True), "height and width swapped: the box's height comes from the image's height, its width "
                              "from the image's width"),
    (_box_mistake(rnd=round), "the sides are truncated, not rounded, to whole pixels"),
    (_box_mistake(corner=True), "the box is centred on (cy, cx): its top-left corner is (cy - h // 2, cx - w // 2)"),
    (_box_mistake(shift=True), "a box that crosses the border is clipped (it loses the part outside the image), not "
                               "moved inside with its full size"),
)
