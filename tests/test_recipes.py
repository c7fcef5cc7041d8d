"""Mechanics of the training recipes of dlo.training: progressive resizing, dynamic batch size (+ LR scaling),
EMA of the weights, test-time augmentation, the batch-transform hook (MixUp/CutMix), and the CLI flags.

Small tensors and tiny networks on the CPU: what is tested is what each switch does, not accuracy.
"""
from __future__ import annotations

import json

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dlo  # noqa: F401  (before torchvision)
from dlo.runtime import paths
from dlo import training as tr
from dlo.data.augment import MixCutMix, soft_cross_entropy
from dlo.training import cli as training_cli

CPU = torch.device("cpu")


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    from dlo.measure.records import torch_threads

    with torch_threads(1):
        yield


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    for var in ("DLO_DATA_DIR", "DSDIR", "DLO_DEVICE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(paths, "CACHE_DIR", tmp_path / "cache")
    monkeypatch.setattr(paths, "ROOT", tmp_path / "project")


class Net(nn.Module):
    """conv -> BN -> ReLU -> global pool -> linear; any image size. Records the input sizes in training."""

    def __init__(self, n_out: int = 2) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, n_out)
        self.train_shapes: list[tuple[int, ...]] = []

    def forward(self, x):
        if self.training:
            self.train_shapes.append(tuple(x.shape))
        return self.fc(torch.relu(self.bn(self.conv(x))).mean(dim=(2, 3)))


def _data(n=64, side=16, seed=0):
    """Two classes told apart by the brightness of the left half of the image (learnable in a few steps)."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 2, (n,), generator=g)
    x = torch.randn(n, 3, side, side, generator=g) * 0.5
    x[:, :, :, : side // 2] += (2.0 * y - 1.0)[:, None, None, None]
    return TensorDataset(x, y)


def _factory(ds, default_batch=8, calls=None):
    def make(generator, batch_size=None):
        if calls is not None:
            calls.append(batch_size)
        return DataLoader(ds, batch_size=batch_size or default_batch, shuffle=True, drop_last=True,
                          generator=generator)
    return make


def _cfg(**kw):
    base = dict(epochs=1, lr=0.05, log_every=1, progress=False, schedule="constant", weight_decay=0.0)
    base.update(kw)
    return tr.TrainConfig(**base)


# --------------------------------------------------------------------------------------------------
# Schedules
# --------------------------------------------------------------------------------------------------

def test_resolution_at_follows_the_schedule():
    sched = [(0, 16), (2, 24), (4, 32)]
    assert [tr.resolution_at(sched, e) for e in range(7)] == [16, 16, 24, 24, 32, 32, 32]
    assert tr.resolution_at([[0, 20]], 9) == 20  # JSON gives lists


def test_batch_size_at_follows_the_schedule():
    sched = [(0, 64), (3, 128)]
    assert [tr.batch_size_at(sched, e) for e in range(5)] == [64, 64, 64, 128, 128]


@pytest.mark.parametrize("sched, word", [([], "empty"), ([(1, 16)], "epoch 0"), ([(0, 16), (0, 24)], "increasing"),
                                         ([(0, 16), (3, 24), (2, 32)], "increasing"), ([(0, 0)], "positive"),
                                         ([(0, 16.5)], "integers"), ("0:16", "pairs"), (None, "pairs")])
def test_bad_schedules_are_refused_in_one_line(sched, word):
    with pytest.raises(ValueError, match=word) as exc:
        tr.resolution_at(sched, 0)
    assert "\n" not in str(exc.value)


def test_bad_epoch_and_config_errors():
    with pytest.raises(ValueError, match="epoch"):
        tr.batch_size_at([(0, 8)], -1)
    with pytest.raises(ValueError, match="batch_schedule"):
        tr.TrainConfig(scale_lr_with_batch=True)
    with pytest.raises(ValueError, match="ema_decay"):
        tr.TrainConfig(ema_decay=1.0)
    with pytest.raises(ValueError, match="resize_schedule"):
        tr.TrainConfig(resize_schedule=[(1, 16)])


# --------------------------------------------------------------------------------------------------
# Progressive resizing
# --------------------------------------------------------------------------------------------------

def test_resize_batch():
    x = torch.randn(2, 3, 32, 32)
    assert tr.resize_batch(x, 32) is x
    y = tr.resize_batch(x, 16)
    assert y.shape == (2, 3, 16, 16) and y.dtype == x.dtype
    const = torch.full((1, 3, 32, 32), 0.7)
    assert torch.allclose(tr.resize_batch(const, 20), torch.full((1, 3, 20, 20), 0.7), atol=1e-6)
    cl = x.contiguous(memory_format=torch.channels_last)
    assert tr.resize_batch(cl, 24).is_contiguous(memory_format=torch.channels_last)


def test_train_resizes_each_epochs_batches_and_evaluates_at_full_size():
    ds = _data(n=32, side=16)
    model = Net()
    seen_eval = []
    val = DataLoader(ds, batch_size=16)
    cfg = _cfg(epochs=4, resize_schedule=[(0, 8), (2, 12), (3, 16)])
    result = tr.train(model, _factory(ds), cfg, val_loader=val)
    sides = [s[-1] for s in model.train_shapes]
    assert sides == [8] * 8 + [12] * 4 + [16] * 4  # 4 batches of 8 per epoch
    epochs = [r for r in result.records if r["event"] == "epoch"]
    assert [r["resolution"] for r in epochs] == [8, 8, 12, 16]
    assert all("val_accuracy" in r for r in epochs)
    seen_eval.append(len(model.train_shapes))


# --------------------------------------------------------------------------------------------------
# Dynamic batch size
# --------------------------------------------------------------------------------------------------

def test_batch_schedule_rebuilds_the_loader_and_the_schedule_spans_all_steps():
    ds = _data(n=64)
    calls = []
    model = Net()
    cfg = _cfg(epochs=3, batch_schedule=[(0, 8), (1, 16), (2, 32)], schedule="onecycle", log_every=100)
    result = tr.train(model, _factory(ds, calls=calls), cfg)
    assert result.step == 8 + 4 + 2  # OneCycleLR raises if stepped past its total: it spans exactly these steps
    assert [s[0] for s in model.train_shapes] == [8] * 8 + [16] * 4 + [32] * 2
    assert set(calls) == {8, 16, 32}  # every loader was built with the epoch's batch size
    assert [r["batch_size"] for r in result.records if r["event"] == "epoch"] == [8, 16, 32]


def test_batch_schedule_scales_the_lr_linearly():
    ds = _data(n=32)
    cfg = _cfg(epochs=2, batch_schedule=[(0, 8), (1, 16)], scale_lr_with_batch=True, lr=0.01)
    result = tr.train(Net(), _factory(ds), cfg)
    lrs = [(r["epoch"], r["lr"]) for r in result.records if r["event"] == "train"]
    assert lrs == [(0, 0.01)] * 4 + [(1, pytest.approx(0.02))] * 2


def test_batch_schedule_needs_a_loader_that_takes_the_batch_size():
    ds = _data(n=32)

    def make(generator):
        return DataLoader(ds, batch_size=8, generator=generator)

    with pytest.raises(ValueError, match="batch_size=None"):
        tr.train(Net(), make, _cfg(batch_schedule=[(0, 8)]))


# --------------------------------------------------------------------------------------------------
# EMA
# --------------------------------------------------------------------------------------------------

def test_ema_update_rule_by_hand():
    model = Net()
    ema = tr.make_ema(model, 0.9)
    with torch.no_grad():
        ema.update_parameters(model)  # the first update copies
        w0, m0 = model.fc.weight.clone(), model.bn.running_mean.clone()
        model.fc.weight.add_(1.0)
        model.bn.running_mean.add_(2.0)
        ema.update_parameters(model)
        model.fc.weight.mul_(3.0)
        ema.update_parameters(model)
    w1 = w0 + 1.0
    w2 = w1 * 3.0
    expected = 0.9 * (0.9 * w0 + 0.1 * w1) + 0.1 * w2
    assert torch.allclose(ema.module.fc.weight, expected, atol=1e-6)
    m1 = m0 + 2.0
    assert torch.allclose(ema.module.bn.running_mean, 0.9 * (0.9 * m0 + 0.1 * m1) + 0.1 * m1, atol=1e-6)  # buffers too
    with pytest.raises(ValueError, match="ema_decay"):
        tr.make_ema(model, 1.5)


def test_train_ema_matches_a_hand_average_and_is_evaluated():
    ds = _data(n=32)
    model = Net()
    snaps = []
    cfg = _cfg(epochs=2, ema_decay=0.8)
    val = DataLoader(ds, batch_size=32)
    result = tr.train(model, _factory(ds), cfg, val_loader=val,
                      on_step=lambda s, v: snaps.append(model.fc.weight.detach().clone()))
    assert len(snaps) == 8
    avg = snaps[0]
    for w in snaps[1:]:
        avg = 0.8 * avg + 0.2 * w
    assert torch.allclose(result.ema_model.module.fc.weight, avg, atol=1e-6)
    assert not torch.allclose(result.model.fc.weight, avg)
    last = [r for r in result.records if r["event"] == "epoch"][-1]
    assert last["val_accuracy"] == tr.evaluate(result.ema_model.module, val, CPU)["accuracy"]


# --------------------------------------------------------------------------------------------------
# TTA
# --------------------------------------------------------------------------------------------------

class Seen(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3 * 4 * 4, 5)
        self.inputs = []

    def forward(self, x):
        self.inputs.append(x.clone())
        return self.fc(x.flatten(1))


def test_tta_averages_the_softmax_of_the_image_and_its_flip():
    torch.manual_seed(0)
    m = Seen()
    x = torch.randn(6, 3, 4, 4)
    with torch.no_grad():
        probs = tr.tta_probabilities(m, x, True)
        expected = (torch.softmax(m.fc(x.flatten(1)), 1) + torch.softmax(m.fc(x.flip(-1).flatten(1)), 1)) / 2
    assert len(m.inputs) == 2 and torch.equal(m.inputs[0], x) and torch.equal(m.inputs[1], x.flip(-1))
    assert torch.allclose(probs, expected, atol=1e-6)
    assert torch.allclose(probs.sum(1), torch.ones(6), atol=1e-6)
    m.inputs.clear()
    three = tr.tta_probabilities(m, x, ["identity", "hflip", lambda t: t.flip(-2)])
    assert len(m.inputs) == 3 and torch.equal(m.inputs[2], x.flip(-2))
    with torch.no_grad():
        exp3 = (2 * expected + torch.softmax(m.fc(x.flip(-2).flatten(1)), 1)) / 3
    assert torch.allclose(three, exp3, atol=1e-6)


def test_evaluate_with_tta_matches_a_hand_computation():
    torch.manual_seed(0)
    m = Seen()
    x, y = torch.randn(10, 3, 4, 4), torch.randint(0, 5, (10,))
    loader = DataLoader(TensorDataset(x, y), batch_size=4)
    out = tr.evaluate(m, loader, CPU, tta=True)
    with torch.no_grad():
        p = (torch.softmax(m.fc(x.flatten(1)), 1) + torch.softmax(m.fc(x.flip(-1).flatten(1)), 1)) / 2
    assert out["accuracy"] == pytest.approx((p.argmax(1) == y).float().mean().item())
    assert out["loss"] == pytest.approx(nn.functional.nll_loss(p.log(), y).item(), rel=1e-5)
    plain = tr.evaluate(m, loader, CPU)
    assert plain["loss"] == pytest.approx(nn.functional.cross_entropy(m.fc(x.flatten(1)), y).item(), rel=1e-5)
    with pytest.raises(ValueError, match="unknown TTA view"):
        tr.evaluate(m, loader, CPU, tta=["vflip"])


def test_train_with_tta_evaluates_both_views():
    ds = _data(n=16)
    calls = []
    model = Net()
    orig = model.forward
    model.forward = lambda x: (calls.append(model.training), orig(x))[1]
    tr.train(model, _factory(ds), _cfg(tta=True), val_loader=DataLoader(ds, batch_size=16))
    assert calls.count(False) == 2  # one validation batch, two views


# --------------------------------------------------------------------------------------------------
# Batch transform: MixUp / CutMix through train()
# --------------------------------------------------------------------------------------------------

def test_soft_target_criterion():
    logits, y = torch.randn(5, 4), torch.tensor([0, 1, 2, 3, 0])
    crit = tr.soft_target_criterion(0.1)
    assert torch.allclose(crit(logits, y), nn.functional.cross_entropy(logits, y, label_smoothing=0.1))
    soft = torch.softmax(torch.randn(5, 4), 1)
    assert torch.allclose(crit(logits, soft), nn.functional.cross_entropy(logits, soft, label_smoothing=0.1), atol=1e-6)
    assert torch.allclose(tr.soft_target_criterion()(logits, soft), soft_cross_entropy(logits, soft))


def test_train_with_mixcutmix_uses_soft_targets_and_learns():
    ds = _data(n=128, side=8)
    mix = MixCutMix(num_classes=2, generator=torch.Generator().manual_seed(0))
    seen = []

    def transform(images, labels):
        images, soft = mix(images, labels)
        seen.append(soft)
        return images, soft

    val = DataLoader(ds, batch_size=128)
    model = Net()
    before = tr.evaluate(model, val, CPU)["loss"]
    result = tr.train(model, _factory(ds, 16), _cfg(epochs=3, lr=0.1, schedule="onecycle"), val_loader=val,
                      batch_transform=transform)
    assert all(t.shape == (16, 2) and t.dtype.is_floating_point for t in seen) and len(seen) == 24
    last = [r for r in result.records if r["event"] == "epoch"][-1]
    assert last["val_loss"] < before and last["val_accuracy"] > 0.8
    with pytest.raises(ValueError, match="batch_transform"):
        tr.train(Net(), _factory(ds), _cfg(), batch_transform="mixup")


# --------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------

def test_cli_with_the_recipe_flags(tmp_path, capsys):
    out = tmp_path / "out.json"
    rc = training_cli.main(["--generated", "--n-train", "40", "--width", "2", "--epochs", "2", "--batch-schedule", "0:8,1:16",
                  "--scale-lr", "--resize-schedule", "0:16,1:32", "--ema-decay", "0.9", "--label-smoothing", "0.1",
                  "--mixcutmix", "--eval", "--tta", "--no-progress", "--log-every", "100",
                  "--tracking-dir", str(tmp_path / "trk"), "--run-name", "cli", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    records = json.loads(out.read_text())["records"]
    epochs = [r for r in records if r["event"] == "epoch"]
    assert [(r["batch_size"], r["resolution"]) for r in epochs] == [(8, 16), (16, 32)]
    assert all("val_accuracy" in r for r in epochs)
    assert (tmp_path / "trk" / "mlruns").is_dir()


@pytest.mark.parametrize("args, word", [(["--batch-schedule", "0-8"], "EPOCH:VALUE"), (["--tta"], "--eval")])
def test_cli_recipe_errors(args, word, capsys):
    rc = training_cli.main(["--generated", "--n-train", "16", "--steps", "1", "--no-progress", *args])
    assert rc == 2  # a bad option, as a refused combination: one line and exit code 2
    assert word in capsys.readouterr().err
