"""Kill-and-resume is bit-exact for every switch of the training loop: a run stopped by SIGTERM in the middle of
an epoch and resumed from its checkpoint ends with the same weights, bit for bit, as a run never stopped.

The stop is real: a callback sends SIGTERM to this process after step ``k`` (the loop's StopSignal turns it into a
checkpoint and a clean return), then the same configuration resumes. Every source of randomness a switch uses
(shuffling, MixCutMix's own generator, EMA weights, the LR schedule, the fp16 scaler) must be in the checkpoint,
or the weights differ."""
from __future__ import annotations

import os
import signal

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dlo.data.augment import MixCutMix
from dlo.training import Callback, TrainConfig, train

N, STOP_AT = 48, 5  # 6 batches of 8 per epoch, 2 epochs: the stop falls inside the first epoch


def _data():
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(N, 3, 16, 16, generator=g), torch.randint(0, 4, (N,), generator=g))


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Dropout(0.2), nn.Linear(4, 4))


def _make_loader(ds):
    def make(generator, batch_size=8):
        return DataLoader(ds, batch_size=batch_size, shuffle=True, generator=generator, drop_last=True)
    return make


class _KillAt(Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, state, loss) -> None:
        if state.step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


SWITCHES = {
    "plain": {},
    "mixcutmix": {"transform": True},
    "ema": {"ema_decay": 0.9},
    "batch_schedule": {"batch_schedule": [(0, 8), (1, 12)], "scale_lr_with_batch": True},
    "resize": {"resize_schedule": [(0, 12), (1, 16)]},
    "accumulation": {"accum_steps": 2},
    "label_smoothing_clip": {"label_smoothing": 0.1, "clip_grad_norm": 0.5},
    "bf16": {"amp": "bf16"},
    "warmup_cosine_adamw": {"optimizer": "adamw", "schedule": "warmup_cosine", "warmup_steps": 2, "lr": 1e-3},
}


@pytest.mark.parametrize("switch", sorted(SWITCHES))
def test_kill_and_resume_is_bit_exact(switch, tmp_path):
    opts = dict(SWITCHES[switch])
    transform = opts.pop("transform", False)
    ds = _data()

    def run(ckpt, resume=False, callbacks=()):
        mix = MixCutMix(num_classes=4, generator=torch.Generator().manual_seed(1)) if transform else None
        cfg = TrainConfig(**{"lr": 0.05, **opts}, epochs=2, seed=3, progress=False, log_every=1, ckpt_path=str(ckpt),
                          resume=resume)
        model = _model()
        result = train(model, _make_loader(ds), cfg, "cpu", batch_transform=mix, callbacks=callbacks)
        return model, result

    whole, res = run(tmp_path / "whole.pt")
    assert res.completed
    _, stopped = run(tmp_path / "cut.pt", callbacks=[_KillAt(STOP_AT)])
    assert stopped.stopped_by == "SIGTERM" and stopped.step == STOP_AT
    resumed, res2 = run(tmp_path / "cut.pt", resume=True)
    assert res2.completed and res2.step == res.step
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), f"{switch}: {name} differs after kill and resume"
    if res.ema_model is not None:  # the EMA weights are what gets evaluated: they must match too
        for (name, a), b in zip(res.ema_model.state_dict().items(), res2.ema_model.state_dict().values()):
            assert torch.equal(a, b), f"{switch}: EMA {name} differs after kill and resume"
