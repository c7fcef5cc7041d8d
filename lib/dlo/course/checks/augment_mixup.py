"""The batched MixUp checker's comparison: on each case of :func:`.augment_cases.mixup_cases`, the inputs untouched,
the images' dtype kept, the mixed images and targets equal to :func:`dlo.data.augment.mixup_reference`'s, then the
gradients of the images and the targets (a seeded cotangent) equal to the reference's. A known mistake is named only
when its mix gives the answer's images on every case tried."""
from __future__ import annotations

from typing import Callable

import torch

from dlo.course.checks.cases import Case, compare, first_failure
from dlo.course.checks.framework import CheckFailed, expect
from dlo.data.augment import MixParams, mixup_reference


def _reference(images, targets, lam, perm):
    return mixup_reference(images, targets, MixParams(lam.double(), perm))


_MISTAKES = (
    (lambda lam, perm: (1 - lam, perm), "the weights are swapped: each image keeps lam[i] of itself and takes "
                                        "1 - lam[i] from its partner"),
    (lambda lam, perm: (lam[:1].expand(len(lam)).clone(), perm), "every image used lam[0]: each image has its own "
                                                                 "lam[i]"),
    (lambda lam, perm: (lam.mean().expand(len(lam)).clone(), perm), "every image used the mean lam: each image has "
                                                                    "its own lam[i]"),
    (lambda lam, perm: (lam, torch.arange(len(lam)).roll(1)), "the partners are images.roll(1, 0), not the perm you "
                                                              "are given: gather them with images[perm]"),
)


def _named(tried: list[tuple[Case, torch.Tensor]]) -> str:
    for change, message in _MISTAKES:
        def gives(case: Case, got: torch.Tensor) -> bool:
            kw = case.kwargs
            want = _reference(kw["images"], kw["targets"], *change(kw["lam"], kw["perm"]))[0]
            return compare(got, want, "x", dtype=kw["images"].dtype) is None
        if all(gives(case, got) for case, got in tried):
            return f": {message}"
    return ""


def _call(mixup_batch: Callable, case: Case, images, targets):
    kw = case.kwargs
    try:
        out = mixup_batch(images, targets, kw["lam"].clone(), kw["perm"].clone())
    except (NotImplementedError, CheckFailed):
        raise
    except Exception as exc:  # noqa: BLE001 - any error of the answer is reported, in one line
        raise CheckFailed(f"with {case.label}: it raised {type(exc).__name__}: "
                          f"{(str(exc).splitlines() or [''])[0][:200]}") from None
    expect(isinstance(out, tuple) and len(out) == 2 and all(isinstance(t, torch.Tensor) for t in out),
           f"with {case.label}: return a tuple (mixed_images, mixed_targets)")
    return out


def check_mixup_cases(mixup_batch: Callable, cases: list[Case]) -> int:
    tried: list[tuple[Case, torch.Tensor]] = []
    for case in cases:
        kw = case.kwargs
        images, targets = kw["images"].clone(), kw["targets"].clone()
        got_x, got_t = _call(mixup_batch, case, images, targets)
        expect(torch.equal(images, kw["images"]) and torch.equal(targets, kw["targets"]),
               f"with {case.label}: do not modify the inputs in place (no mul_/add_ on images or targets)")
        name = str(images.dtype).replace("torch.", "")
        expect(got_x.dtype == images.dtype, f"with {case.label}: {name} images came out as {got_x.dtype}: the mixed "
               f"batch keeps the images' dtype (a float32 lam times {name} images is promoted to float32)")
        ref_x, ref_t = _reference(images, targets, kw["lam"], kw["perm"])
        tried.append((case, got_x.detach()))
        problem = compare(got_x, ref_x, "the mixed images", dtype=images.dtype)
        if problem:
            raise CheckFailed(f"with {case.label}: {problem}" + _named(tried))
        problem = compare(got_t, ref_t, "the mixed targets")
        expect(problem is None, f"with {case.label}: {problem}: each label is mixed with its partner's, with the "
               "same weights as the images")
        grads = Case(case.label, {"images": images, "targets": targets}, case.size)
        failure = first_failure([grads], lambda images, targets: mixup_batch(images, targets, kw["lam"], kw["perm"]),
                                lambda images, targets: _reference(images, targets, kw["lam"], kw["perm"]),
                                grads=True)
        if failure:
            raise CheckFailed(f"with {case.label}: {failure[1]}")
    return len(cases)
