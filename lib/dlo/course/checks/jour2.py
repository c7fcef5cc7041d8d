"""Checkers of the Jour 2 notebooks: ``dataloader`` (Jour2/dataloader.ipynb) and ``augment``
(Jour2/augment.ipynb). The ``ddp`` steps are in :mod:`dlo.checks_ddp`."""
from __future__ import annotations

import time
from typing import Callable

from dlo.course.checks.framework import CheckFailed, expect, register
from dlo.data.augment import cutmix_boxes
from dlo.data.augment import MixParams, mixup_reference, sample_mix_params

LOADER_NB = "Jour2/dataloader.ipynb"


class _SlowLoader:
    """An iterable whose ``iter()`` takes ``start_s`` and whose batches take the given times."""

    def __init__(self, start_s: float, batch_s: list[float]) -> None:
        self.start_s, self.batch_s = start_s, batch_s
        self.served = 0

    def __iter__(self):
        time.sleep(self.start_s)
        return self._batches()

    def _batches(self):
        for i, s in enumerate(self.batch_s):
            time.sleep(s)
            self.served += 1
            yield i


@register("dataloader", "wait", ("wait_times",), LOADER_NB)
def _check_wait(wait_times: Callable) -> str:
    fake = _SlowLoader(0.15, [0.05, 0.0, 0.12, 0.0, 0.06, 0.3, 0.3])
    out = wait_times(fake, 5)
    expect(isinstance(out, tuple) and len(out) == 2, "return a tuple (first_s, waits)")
    first, waits = out
    expect(fake.served <= 5, f"fetch n_iters = 5 batches, not {fake.served}")
    expect(len(waits) == 4, f"waits holds the n_iters - 1 = 4 batches after the first, got {len(waits)}")
    expect(0.19 <= first < 0.35, f"first_s must include iter() (0.15 s here) and the first batch (0.05 s): got {first:.3f} s")
    expected = [0.0, 0.12, 0.0, 0.06]
    bad = [(i, w, e) for i, (w, e) in enumerate(zip(waits, expected)) if not (e - 0.005 <= w < e + 0.08)]
    if bad:
        i, w, e = bad[0]
        raise CheckFailed(f"wait {i} should be about {e:.2f} s (time inside next()), got {w:.3f} s")
    return "first-batch latency and per-batch waits measured around iter() and next()"


@register("dataloader", "budget", ("workers_per_rank",), LOADER_NB)
def _check_budget(workers_per_rank: Callable) -> str:
    cases = {(10, 1): 9, (40, 4): 9, (16, 4): 3, (4, 4): 0, (2, 1): 1, (3, 2): 0, (1, 1): 0, (1, 4): 0}
    for (cores, ranks), expected in cases.items():
        got = workers_per_rank(cores, ranks)
        expect(got == expected, f"{cores} cores shared by {ranks} rank(s): {expected} workers per rank, got {got!r}")
    return "cores split between ranks, one kept per rank for its training loop"


# --------------------------------------------------------------------------------------------------
# augment
# --------------------------------------------------------------------------------------------------
AUGMENT_NB = "Jour2/augment.ipynb"


@register("augment", "box", ("cutmix_box",), AUGMENT_NB)
def _check_box(cutmix_box: Callable) -> str:
    import torch


    g = torch.Generator().manual_seed(0)
    cases = [(0.3, 30, 2, 32, 32), (0.0, 16, 16, 32, 32), (0.999, 5, 5, 32, 32), (0.5, 0, 0, 24, 40)]
    for _ in range(200):
        h, w = int(torch.randint(2, 48, (1,), generator=g)), int(torch.randint(2, 48, (1,), generator=g))
        lam = float(torch.rand((), generator=g))
        cases.append((lam, int(torch.randint(h, (1,), generator=g)), int(torch.randint(w, (1,), generator=g)), h, w))
    for lam, cy, cx, h, w in cases:
        expected = tuple(cutmix_boxes(torch.tensor([lam], dtype=torch.float64), torch.tensor([cy]), torch.tensor([cx]),
                                      h, w)[0].tolist())
        got = cutmix_box(lam, cy, cx, h, w)
        expect(isinstance(got, tuple) and len(got) == 4, f"return a tuple (y0, y1, x0, x1), got {got!r}")
        got = tuple(int(v) for v in got)
        if got != expected:
            y0, y1, x0, x1 = got
            if min(got) < 0 or y1 > h or x1 > w:
                raise CheckFailed(f"lam={lam:.3f}, centre ({cy}, {cx}) in {h}x{w}: box {got} leaves the image: clip it")
            raise CheckFailed(f"lam={lam:.3f}, centre ({cy}, {cx}) in a {h}x{w} image: expected {expected}, got {got} "
                              "(the sides are floor(height * sqrt(1 - lam)) and floor(width * sqrt(1 - lam)), so that "
                              "the area is 1 - lam of the image)")
    return f"{len(cases)} boxes identical to dlo.data.augment.cutmix_boxes (sizes from sqrt(1 - lam), clipped)"


@register("augment", "mixup", ("mixup_batch",), AUGMENT_NB)
def _check_mixup(mixup_batch: Callable) -> str:
    import torch


    g = torch.Generator().manual_seed(0)
    for channels_last in (False, True):
        images = torch.rand(6, 3, 5, 7, generator=g)
        if channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        targets = torch.nn.functional.one_hot(torch.arange(6) % 4, 4).float()
        params = sample_mix_params(6, 0.4, generator=g)
        before_x, before_t = images.clone(), targets.clone()
        got_x, got_t = mixup_batch(images, targets, params.lam.float(), params.perm)
        expect(torch.equal(images, before_x) and torch.equal(targets, before_t),
                "do not modify the inputs in place (no mul_/add_ on images or targets)")
        ref_x, ref_t = mixup_reference(images, targets, MixParams(params.lam, params.perm))
        expect(got_x.shape == images.shape, f"mixed images must keep the shape {tuple(images.shape)}, got {tuple(got_x.shape)}")
        expect(torch.allclose(got_x, ref_x, atol=1e-5), "mixed images differ from the reference loop: "
                "lam[i] * x[i] + (1 - lam[i]) * x[perm[i]], with lam reshaped to [B, 1, 1, 1]")
        expect(got_t.shape == targets.shape and torch.allclose(got_t, ref_t, atol=1e-6),
                "mixed targets differ from the reference: lam[:, None] * t + (1 - lam[:, None]) * t[perm]")
        expect(torch.allclose(got_t.sum(1), torch.ones(6)), "mixed targets must still sum to 1")
    return "batched MixUp equals the per-image loop, inputs untouched, any memory format"


@register("augment", "accuracy", ("mixed_accuracy",), AUGMENT_NB)
def _check_accuracy(mixed_accuracy: Callable) -> str:
    import torch

    logits = torch.tensor([[5.0, 0.0, 0.0], [0.0, 5.0, 0.0], [0.0, 0.0, 5.0], [5.0, 0.0, 0.0]])  # predicts 0, 1, 2, 0
    hard = torch.tensor([0, 1, 1, 2])
    got = mixed_accuracy(logits, hard)
    expect(isinstance(got, float), f"return a Python float (use .item()), got {type(got).__name__}")
    expect(abs(got - 0.5) < 1e-6, f"integer labels: 2 of 4 right -> 0.5, got {got!r}")
    soft = torch.tensor([[0.7, 0.3, 0.0], [0.0, 0.2, 0.8], [0.0, 0.6, 0.4], [0.5, 0.0, 0.5]])
    got = mixed_accuracy(logits, soft)
    expected = (0.7 + 0.2 + 0.4 + 0.5) / 4
    expect(isinstance(got, float) and abs(got - expected) < 1e-6,
            f"soft targets: mean of targets[i, prediction_i] = (0.7 + 0.2 + 0.4 + 0.5) / 4 = {expected:.3f}, got {got!r}")
    return "hard labels: usual accuracy; soft labels: each prediction scores its class's weight"
