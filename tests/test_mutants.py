"""Tests written to kill the mutants of tools/mutate.py that survived the rest of the suite: each pins one
property that a plausible slip would break while every other test still passed."""
from __future__ import annotations

import torch
from torch.nn import functional as F

from dlo.training.callbacks import resize_batch
from dlo.training.loop import epoch_generator


def test_each_epoch_has_its_own_shuffle_and_the_same_epoch_the_same():
    """A generator that ignored the epoch would shuffle every epoch alike (a resumed run would not notice)."""
    orders = [torch.randperm(1000, generator=epoch_generator(7, e)) for e in range(4)]
    assert all(not torch.equal(orders[i], orders[j]) for i in range(4) for j in range(i + 1, 4))
    assert torch.equal(orders[2], torch.randperm(1000, generator=epoch_generator(7, 2)))
    assert not torch.equal(orders[0], torch.randperm(1000, generator=epoch_generator(8, 0)))  # the seed counts too


def test_shrinking_a_batch_is_antialiased():
    """Shrinking without antialiasing aliases fine patterns (a checkerboard becomes a checkerboard again, or
    noise) instead of averaging them to grey; upscaling must not antialias (torch ignores it, but the
    reference below makes the comparison exact)."""
    board = (torch.arange(32)[:, None] + torch.arange(32)[None, :]) % 2
    x = board.float().expand(2, 3, 32, 32).contiguous()
    small = resize_batch(x, 16)
    assert torch.allclose(small, F.interpolate(x, size=(16, 16), mode="bilinear", align_corners=False, antialias=True))
    assert small.std() < 0.05  # a fine checkerboard averages to flat grey
    big = resize_batch(x[:, :, :8, :8], 16)
    assert torch.allclose(big, F.interpolate(x[:, :, :8, :8], size=(16, 16), mode="bilinear", align_corners=False))


def test_onecycle_on_a_few_steps_trains():
    """onecycle's rising phase is pct_start x total - 1 steps, a divisor in torch: 0.25 x 4 steps gave a
    ZeroDivisionError. Short runs (a smoke test, a 4-step check) must train."""
    from torch import nn

    from dlo.data.loaders import Batches
    from dlo.training import TrainConfig, train

    x, y = torch.randn(16, 4), torch.randint(0, 2, (16,))
    for steps in (3, 4, 5, 8):
        model = nn.Linear(4, 2)
        res = train(model, lambda g: Batches(lambda: ((x[i:i + 4], y[i:i + 4]) for i in range(0, 16, 4)), 4),
                    TrainConfig(epochs=2, steps=steps, progress=False, log_every=1), "cpu")
        lrs = [r["lr"] for r in res.records if r["event"] == "train"]
        assert res.step == steps and len(lrs) == steps and max(lrs) > lrs[0] and lrs[-1] < max(lrs)
