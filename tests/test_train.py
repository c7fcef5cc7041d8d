"""Tests of dlo.training: the step function, device switches, evaluation, checkpoints, signals, exact resume
(in-process and through the command line, by killing a real run with SIGTERM), and the CLI's errors.

Everything runs on the CPU with a width-4 ResNet and small generated datasets.
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import dlo  # noqa: F401  (before torchvision: prepares its import)
from dlo import data
from dlo.runtime import paths
from dlo import training as tr
from dlo.models import resnet18_cifar
import dlo.training.loop
from dlo.training import cli as training_cli

CPU = torch.device("cpu")


def one_line(text: str) -> str:
    assert text and "\n" not in text.strip(), f"expected one line: {text!r}"
    return text.strip()


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One intra-op thread: on 2 shared cores, two OpenMP threads that wait on each other at every layer are
    many times slower as soon as another process runs (the results under test do not depend on it)."""
    from dlo.measure.records import torch_threads

    with torch_threads(1):
        yield


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """No real data, no project cache, no forced device."""
    for var in ("DLO_DATA_DIR", "DSDIR", "DLO_DEVICE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(paths, "CACHE_DIR", tmp_path / "cache")
    monkeypatch.setattr(paths, "ROOT", tmp_path / "project")


# --------------------------------------------------------------------------------------------------
# amp_dtype, TrainConfig
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, expected", [("bf16", torch.bfloat16), ("fp16", torch.float16), (None, None),
                                            ("none", None), ("fp32", None), (torch.bfloat16, torch.bfloat16)])
def test_amp_dtype_mapping(name, expected):
    assert tr.amp_dtype(name) is expected


@pytest.mark.parametrize("name", ["fp8", "BF16", "float16", ""])
def test_amp_dtype_unknown(name):
    with pytest.raises(ValueError, match="unknown amp dtype"):
        tr.amp_dtype(name)


def test_autocast_context_none_is_noop():
    with tr.autocast_context(CPU, None):
        assert not torch.is_autocast_enabled("cpu")
    with tr.autocast_context(CPU, torch.bfloat16):
        assert torch.is_autocast_enabled("cpu")


def test_make_grad_scaler_only_for_fp16():
    assert tr.make_grad_scaler(CPU, None) is None
    assert tr.make_grad_scaler(CPU, torch.bfloat16) is None
    assert isinstance(tr.make_grad_scaler(CPU, torch.float16), torch.amp.GradScaler)


@pytest.mark.parametrize("kwargs, word", [
    (dict(lr=0), "lr"), (dict(lr=-0.1), "lr"), (dict(epochs=0), "epochs"), (dict(steps=0), "steps"),
    (dict(steps=-5), "steps"), (dict(resume=True), "ckpt_path"), (dict(amp="fp8"), "amp"),
])
def test_train_config_validation(kwargs, word):
    with pytest.raises(ValueError, match=word):
        tr.TrainConfig(**kwargs)


def test_train_config_valid():
    cfg = tr.TrainConfig(steps=3, amp="bf16", resume=True, ckpt_path="x.pt")
    assert cfg.steps == 3 and cfg.amp == "bf16"


# --------------------------------------------------------------------------------------------------
# make_train_step
# --------------------------------------------------------------------------------------------------

class Recorder(nn.Module):
    """A linear classifier that notes, at each forward, whether CPU autocast is on and the mode."""

    def __init__(self, n_in: int = 6, n_out: int = 3) -> None:
        super().__init__()
        self.lin = nn.Linear(n_in, n_out)
        self.autocast: list[bool] = []
        self.autocast_dtype: list[torch.dtype] = []
        self.modes: list[bool] = []

    def forward(self, x):
        self.autocast.append(torch.is_autocast_enabled("cpu"))
        self.autocast_dtype.append(torch.get_autocast_dtype("cpu"))
        self.modes.append(self.training)
        return self.lin(x)


def _batch(n=8, n_in=6, n_out=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, n_in, generator=g), torch.randint(0, n_out, (n,), generator=g)


def test_train_step_fp32_updates_and_returns_detached_scalar():
    torch.manual_seed(0)
    model = Recorder()
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step = tr.make_train_step(model, opt, nn.CrossEntropyLoss(), CPU)
    x, y = _batch()
    loss = step(x, y)
    assert isinstance(loss, torch.Tensor) and loss.dim() == 0
    assert not loss.requires_grad and loss.grad_fn is None
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx(nn.functional.cross_entropy(nn.functional.linear(x, *before), y).item(),
                                        rel=1e-5)
    assert all(not torch.equal(b, p) for b, p in zip(before, model.parameters()))
    assert model.autocast == [False]


def test_train_step_bf16_runs_under_autocast():
    torch.manual_seed(0)
    model = Recorder()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step = tr.make_train_step(model, opt, nn.CrossEntropyLoss(), CPU, dtype=torch.bfloat16)
    before = model.lin.weight.detach().clone()
    loss = step(*_batch())
    assert model.autocast == [True]
    assert model.autocast_dtype == [torch.bfloat16]
    assert not torch.is_autocast_enabled("cpu")  # switched off again after the step
    assert torch.isfinite(loss)
    assert model.lin.weight.dtype == torch.float32  # parameters stay fp32 (autocast casts copies)
    assert not torch.equal(before, model.lin.weight)


def test_train_step_fp16_with_grad_scaler_on_cpu():
    torch.manual_seed(0)
    model = Recorder()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = tr.make_grad_scaler(CPU, torch.float16)
    step = tr.make_train_step(model, opt, nn.CrossEntropyLoss(), CPU, dtype=torch.float16, scaler=scaler)
    before = model.lin.weight.detach().clone()
    losses = [step(*_batch(seed=i)) for i in range(3)]
    assert model.autocast == [True] * 3 and model.autocast_dtype == [torch.float16] * 3
    assert all(torch.isfinite(v) for v in losses)
    assert scaler.get_scale() > 0
    assert not torch.equal(before, model.lin.weight)
    assert torch.isfinite(model.lin.weight).all()


def _grad_norm(model):
    return torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()])).item()


def test_train_step_clip_grad_norm():
    """lr=0: the step leaves the parameters and keeps the (clipped) gradients for inspection."""
    torch.manual_seed(0)
    x, y = _batch()
    x = x * 1000  # huge inputs, huge gradients
    model = Recorder()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    tr.make_train_step(model, opt, nn.CrossEntropyLoss(), CPU)(x, y)
    unclipped = _grad_norm(model)
    assert unclipped > 10
    tr.make_train_step(model, opt, nn.CrossEntropyLoss(), CPU, clip_grad_norm=1.0)(x, y)
    assert _grad_norm(model) <= 1.0 + 1e-4


def test_train_step_clip_grad_norm_with_scaler_clips_unscaled_gradients():
    torch.manual_seed(0)
    x, y = _batch()
    x = x * 100
    model = Recorder()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8)
    step = tr.make_train_step(model, opt, nn.CrossEntropyLoss(), CPU, dtype=torch.float16, scaler=scaler,
                              clip_grad_norm=0.5)
    step(x, y)
    norm = _grad_norm(model)
    assert norm == pytest.approx(0.5, rel=1e-2)  # unscaled, then clipped: not 0.5 * scale


# --------------------------------------------------------------------------------------------------
# Device options
# --------------------------------------------------------------------------------------------------

def test_cudnn_benchmark_on_cpu_is_refused():
    with pytest.raises(ValueError) as exc:
        tr.check_device_options(CPU, cudnn_benchmark=True)
    assert "GPU" in one_line(str(exc.value))
    with pytest.raises(ValueError, match="GPU"):
        tr.prepare_model(nn.Linear(2, 2), CPU, cudnn_benchmark=True)


@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune"])
def test_gpu_compile_modes_on_cpu_are_refused(mode):
    with pytest.raises(ValueError) as exc:
        tr.check_device_options(CPU, compile_mode=mode)
    assert mode in one_line(str(exc.value))
    with pytest.raises(ValueError):
        tr.prepare_model(nn.Linear(2, 2), CPU, compile=True, compile_mode=mode)


def test_cpu_options_that_are_fine():
    tr.check_device_options(CPU)
    tr.check_device_options(CPU, compile_mode="default", dtype=torch.bfloat16)
    old = torch.backends.cudnn.benchmark
    model = tr.prepare_model(resnet18_cifar(width=4), CPU, channels_last=True)
    assert model.conv1.weight.is_contiguous(memory_format=torch.channels_last)
    assert torch.backends.cudnn.benchmark == old  # untouched on CPU


def test_train_refuses_cudnn_benchmark_on_cpu():
    with pytest.raises(ValueError, match="GPU"):
        tr.train(nn.Linear(2, 2), lambda g: [], tr.TrainConfig(cudnn_benchmark=True, progress=False), CPU)


# --------------------------------------------------------------------------------------------------
# evaluate
# --------------------------------------------------------------------------------------------------

def _eval_model():
    model = Recorder(n_in=2, n_out=3)
    with torch.no_grad():
        model.lin.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, -1.0]]))
        model.lin.bias.zero_()
    return model


def test_evaluate_matches_hand_computation():
    model = _eval_model()
    x = torch.tensor([[2.0, 0.0], [0.0, 2.0], [-1.0, -2.0], [1.0, 3.0], [5.0, 1.0]])
    y = torch.tensor([0, 1, 2, 0, 2])  # predictions: 0, 1, 2, 1, 0 -> 3 of 5 right
    loader = [(x[:3], y[:3]), (x[3:], y[3:])]  # uneven batches: the mean is over samples
    out = tr.evaluate(model, loader, CPU)
    assert out["samples"] == 5
    assert out["accuracy"] == pytest.approx(3 / 5)
    expected_loss = nn.functional.cross_entropy(nn.functional.linear(x, model.lin.weight), y).item()
    assert out["loss"] == pytest.approx(expected_loss, rel=1e-6)
    first = tr.evaluate(model, loader, CPU, max_batches=1)
    assert first["samples"] == 3 and first["accuracy"] == pytest.approx(1.0)


def test_evaluate_uses_eval_mode_and_restores_mode():
    model = _eval_model()
    loader = [(torch.randn(4, 2), torch.zeros(4, dtype=torch.long))]
    model.train()
    tr.evaluate(model, loader, CPU)
    assert model.modes == [False]
    assert model.training
    model.eval()
    tr.evaluate(model, loader, CPU)
    assert not model.training


def test_evaluate_no_autograd():
    model = resnet18_cifar(width=4)
    seen = []
    model.fc.register_forward_hook(lambda m, i, o: seen.append((o.requires_grad, torch.is_inference_mode_enabled())))
    tr.evaluate(model, [(torch.randn(2, 3, 32, 32), torch.tensor([0, 1]))], CPU)
    assert seen == [(False, True)]


def test_evaluate_bf16_runs():
    model = _eval_model()
    x = torch.tensor([[2.0, 0.0], [0.0, 2.0]])
    out = tr.evaluate(model, [(x, torch.tensor([0, 1]))], CPU, dtype=torch.bfloat16)
    assert model.autocast == [True]
    assert out["accuracy"] == 1.0


def test_evaluate_empty_loader():
    model = _eval_model().train()
    with pytest.raises(ValueError, match="empty"):
        tr.evaluate(model, [], CPU)
    assert model.training  # restored even on the error


# --------------------------------------------------------------------------------------------------
# Checkpoints
# --------------------------------------------------------------------------------------------------

def _small_setup(seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 5), nn.BatchNorm1d(5), nn.ReLU(), nn.Linear(5, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    return model, opt, sched


def _assert_state_equal(a: dict, b: dict):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_save_checkpoint_is_atomic_and_loadable(tmp_path):
    model, opt, sched = _small_setup()
    path = tr.save_checkpoint(tmp_path / "deep" / "ck.pt", model=model, optimizer=opt, scheduler=sched,
                              step=7, epoch=1, batch_in_epoch=2, note="hello")
    assert path == tmp_path / "deep" / "ck.pt" and path.is_file()
    assert not list(tmp_path.rglob("*.tmp"))
    state = torch.load(path, weights_only=False)
    assert {"model", "optimizer", "scheduler", "scaler", "rng", "step", "epoch", "batch_in_epoch", "extra"} <= state.keys()
    assert (state["step"], state["epoch"], state["batch_in_epoch"]) == (7, 1, 2)
    assert state["extra"] == {"note": "hello"}
    assert state["scaler"] is None


def test_failed_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    model, opt, sched = _small_setup()
    path = tr.save_checkpoint(tmp_path / "ck.pt", model=model, step=1)
    real_save = torch.save

    def crash(obj, f, *a, **k):
        Path(f).write_bytes(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError):
        tr.save_checkpoint(path, model=model, step=2)
    monkeypatch.setattr(torch, "save", real_save)
    assert torch.load(path, weights_only=False)["step"] == 1


def test_load_checkpoint_restores_everything(tmp_path):
    model, opt, sched = _small_setup(0)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    for i in range(3):
        x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        sched.step()
    torch.manual_seed(1234)
    random.seed(1234)
    np.random.seed(1234)
    path = tr.save_checkpoint(tmp_path / "ck.pt", model=model, optimizer=opt, scheduler=sched, scaler=scaler,
                              step=3, epoch=0, batch_in_epoch=3)
    expected_draws = (torch.rand(4), random.random(), np.random.rand())

    model2, opt2, sched2 = _small_setup(99)
    scaler2 = torch.amp.GradScaler("cpu")
    torch.manual_seed(5)
    random.seed(5)
    np.random.seed(5)
    state = tr.load_checkpoint(path, model=model2, optimizer=opt2, scheduler=sched2, scaler=scaler2)
    assert (state["step"], state["epoch"], state["batch_in_epoch"]) == (3, 0, 3)
    _assert_state_equal(model.state_dict(), model2.state_dict())  # BatchNorm buffers included
    for p, p2 in zip(model.parameters(), model2.parameters()):
        assert torch.equal(opt.state[p]["momentum_buffer"], opt2.state[p2]["momentum_buffer"])
    assert sched2.last_epoch == sched.last_epoch == 3
    assert sched2.get_last_lr() == sched.get_last_lr()
    assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    assert scaler2.get_scale() == 1024.0
    draws = (torch.rand(4), random.random(), np.random.rand())
    assert torch.equal(draws[0], expected_draws[0]) and draws[1:] == expected_draws[1:]


def test_checkpoint_loads_with_weights_only_and_restores_every_rng_exactly(tmp_path):
    """Random states are stored as tensors and plain values: the file loads with weights_only=True, and after
    a restore torch, Python (gauss cache included) and numpy (its cached gaussian included) draw the same."""
    model, opt, sched = _small_setup(0)
    torch.manual_seed(77)
    random.seed(77)
    random.gauss(0.0, 1.0)  # leaves a cached second gaussian in Python's state
    np.random.seed(77)
    np.random.standard_normal()  # and in numpy's
    path = tr.save_checkpoint(tmp_path / "ck.pt", model=model, optimizer=opt, scheduler=sched, step=5)
    expected = (torch.rand(5), torch.randn(3), random.random(), random.gauss(0.0, 1.0), np.random.standard_normal(),
                np.random.rand(4).tolist())
    state = torch.load(path, weights_only=True)  # no Python object besides tensors and plain values
    assert state["step"] == 5
    torch.manual_seed(1)
    random.seed(1)
    np.random.seed(1)
    tr.load_checkpoint(path, model=_small_setup(3)[0])
    draws = (torch.rand(5), torch.randn(3), random.random(), random.gauss(0.0, 1.0), np.random.standard_normal(),
             np.random.rand(4).tolist())
    assert torch.equal(draws[0], expected[0]) and torch.equal(draws[1], expected[1])
    assert draws[2:] == expected[2:]


def test_rng_state_in_memory_round_trips():
    saved = tr.rng_state()
    expected = (torch.rand(2), random.random(), np.random.rand())
    tr.set_rng_state(saved)
    again = (torch.rand(2), random.random(), np.random.rand())
    assert torch.equal(again[0], expected[0]) and again[1:] == expected[1:]


def test_save_checkpoint_refuses_what_a_safe_load_would_refuse(tmp_path):
    """An extra that is not a tensor or a plain value would make the checkpoint unloadable: refused at save
    time, in one line, and the previous checkpoint stays."""
    model, _, _ = _small_setup()
    path = tr.save_checkpoint(tmp_path / "ck.pt", model=model, step=1)
    with pytest.raises(ValueError) as exc:
        tr.save_checkpoint(path, model=model, step=2, where=Path("/somewhere"))
    assert "PosixPath" in one_line(str(exc.value))
    assert tr.load_checkpoint(path, model=model)["step"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck.pt"]


@pytest.mark.parametrize("content", [b"", b"random bytes \x00\x01" * 50, "truncated"])
def test_unreadable_checkpoint_is_one_line(tmp_path, content):
    model, _, _ = _small_setup()
    path = tmp_path / "bad.pt"
    if content == "truncated":
        good = tr.save_checkpoint(tmp_path / "good.pt", model=model).read_bytes()
        content = good[: len(good) // 2]
    path.write_bytes(content)
    with pytest.raises(ValueError) as exc:
        tr.load_checkpoint(path, model=model)
    assert str(path) in one_line(str(exc.value))


def test_checkpoint_of_another_model_shape_is_one_line(tmp_path):
    path = tr.save_checkpoint(tmp_path / "ck.pt", model=resnet18_cifar(width=4))
    with pytest.raises(ValueError) as exc:
        tr.load_checkpoint(path, model=resnet18_cifar(width=8))
    assert "another model shape" in one_line(str(exc.value))


def test_load_checkpoint_without_rng_restore(tmp_path):
    model, _, _ = _small_setup()
    torch.manual_seed(1)
    path = tr.save_checkpoint(tmp_path / "ck.pt", model=model)
    other = _small_setup(3)[0]
    torch.manual_seed(2)
    expected = torch.rand(3)
    torch.manual_seed(2)
    tr.load_checkpoint(path, model=other, restore_rng=False)
    assert torch.equal(torch.rand(3), expected)


def test_checkpoint_of_wrapped_model_has_plain_keys(tmp_path):
    model, _, _ = _small_setup()
    wrapped = nn.DataParallel(model)  # a `.module` wrapper, like DDP
    path = tr.save_checkpoint(tmp_path / "ck.pt", model=wrapped)
    keys = torch.load(path, weights_only=False)["model"].keys()
    assert not any(k.startswith("module.") for k in keys)
    plain = _small_setup(7)[0]
    tr.load_checkpoint(path, model=plain)
    _assert_state_equal(plain.state_dict(), model.state_dict())


def test_load_missing_checkpoint(tmp_path):
    model, _, _ = _small_setup()
    with pytest.raises(FileNotFoundError) as exc:
        tr.load_checkpoint(tmp_path / "nope.pt", model=model)
    assert "nope.pt" in one_line(str(exc.value))


# --------------------------------------------------------------------------------------------------
# StopSignal
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["SIGUSR1", "SIGTERM"])
def test_stop_signal_sets_flag_and_restores_handler(name):
    sig = getattr(signal, name)
    original = signal.getsignal(sig)
    calls = []

    def previous(signum, frame):
        calls.append(signum)

    signal.signal(sig, previous)
    try:
        with tr.StopSignal() as stop:
            assert not stop and stop.received is None
            os.kill(os.getpid(), sig)
            for _ in range(100):  # the Python-level handler runs at the next bytecode boundary
                if stop:
                    break
                time.sleep(0.01)
            assert stop.received == name
            assert bool(stop)
        assert signal.getsignal(sig) is previous
        assert calls == []  # the old handler was not called while ours was installed
    finally:
        signal.signal(sig, original)


def test_stop_signal_outside_main_thread_is_harmless():
    errors = []

    def body():
        try:
            with tr.StopSignal() as stop:
                assert not stop
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert errors == []


# --------------------------------------------------------------------------------------------------
# train(): bounded runs and exact in-process resume
# --------------------------------------------------------------------------------------------------

N_TRAIN, BATCH = 40, 8  # 5 batches per epoch (drop_last)
N_STEPS = 12  # crosses two epoch boundaries


@pytest.fixture(scope="module")
def train_set(tmp_path_factory):
    root = data.make_generated_cifar10(tmp_path_factory.mktemp("gen"), n_train=N_TRAIN, n_test=10, seed=0)
    return data.cifar10("train", root, data.train_transform(), generated=True, n_train=N_TRAIN, n_test=10,
                        verbose=False)


def _loader_factory(dataset, workers):
    def make(generator):
        return data.make_loader(dataset, BATCH, shuffle=True, num_workers=workers, drop_last=True,
                                generator=generator)
    return make


def _model(seed=0):
    torch.manual_seed(seed)
    return resnet18_cifar(width=4)


def test_train_steps_bound_the_run(train_set):
    cfg = tr.TrainConfig(steps=3, log_every=1, progress=False, lr=0.01)
    losses = []
    result = tr.train(_model(), _loader_factory(train_set, 0), cfg, on_step=lambda s, v: losses.append((s, v)))
    assert result.step == 3 and result.completed and result.stopped_by is None
    assert [r["step"] for r in result.records if r["event"] == "train"] == [1, 2, 3]
    assert [s for s, _ in losses] == [1, 2, 3]
    assert all(np.isfinite(v) for _, v in losses)
    assert result.checkpoint is None
    json.dumps(result.records)


def test_train_whole_epochs_with_validation_and_final_checkpoint(train_set, tmp_path):
    val = data.make_loader(train_set, 8, shuffle=False)
    ck = tmp_path / "ck.pt"
    cfg = tr.TrainConfig(epochs=2, log_every=100, progress=False, ckpt_path=str(ck))
    result = tr.train(_model(), _loader_factory(train_set, 0), cfg, val_loader=val)
    assert result.step == 2 * (N_TRAIN // BATCH)
    epochs = [r for r in result.records if r["event"] == "epoch"]
    assert [r["epoch"] for r in epochs] == [0, 1]
    assert all(0.0 <= r["val_accuracy"] <= 1.0 and np.isfinite(r["val_loss"]) for r in epochs)
    assert [r["step"] for r in result.records if r["event"] == "train"] == [result.step]  # the last step is logged
    state = torch.load(ck, weights_only=False)
    assert state["step"] == result.step and (state["epoch"], state["batch_in_epoch"]) == (2, 0)
    assert result.checkpoint == str(ck)


@pytest.mark.parametrize("optimizer, schedule", [("adamw", "warmup_cosine"), ("lion", "constant"), ("lars", "step")])
def test_train_uses_the_named_optimizer_and_schedule(train_set, optimizer, schedule):
    cfg = tr.TrainConfig(steps=4, log_every=1, progress=False, lr=1e-3, optimizer=optimizer, schedule=schedule,
                         warmup_steps=2 if schedule == "warmup_cosine" else 0)
    result = tr.train(_model(), _loader_factory(train_set, 0), cfg)
    lrs = [r["lr"] for r in result.records if r["event"] == "train"]
    assert len(lrs) == 4 and all(np.isfinite(lr) for lr in lrs)
    if schedule == "warmup_cosine":
        assert lrs[0] < lrs[1] == pytest.approx(1e-3)  # ramp, then the peak
    if schedule == "constant":
        assert lrs == [1e-3] * 4


def test_train_rejects_unknown_optimizer_in_one_line(train_set):
    with pytest.raises(ValueError, match="unknown optimizer 'adamx'") as err:
        tr.train(_model(), _loader_factory(train_set, 0), tr.TrainConfig(steps=1, progress=False, optimizer="adamx"))
    assert "\n" not in str(err.value)


def test_train_passes_accum_steps_to_the_step(train_set):
    """accum_steps reaches make_train_step: one optimizer step per batch, whatever k."""
    cfg = tr.TrainConfig(steps=2, log_every=1, progress=False, lr=0.01, accum_steps=4)
    result = tr.train(_model(), _loader_factory(train_set, 0), cfg)
    assert result.step == 2


def test_train_early_stopping_stops_and_restores_the_best(train_set, monkeypatch):
    accuracies = iter([0.3, 0.5, 0.4, 0.45, 0.9, 0.9])
    snapshots = []

    def fake_evaluate(model, loader, device, dtype=None, channels_last=False, max_batches=None):
        snapshots.append({k: v.clone() for k, v in model.state_dict().items()})
        return {"loss": 1.0, "accuracy": next(accuracies), "samples": 8}

    monkeypatch.setattr(dlo.training.loop, "evaluate", fake_evaluate)
    val = data.make_loader(train_set, 8, shuffle=False)
    cfg = tr.TrainConfig(epochs=6, log_every=100, progress=False, early_stopping=2)
    result = tr.train(_model(), _loader_factory(train_set, 0), cfg, val_loader=val)
    events = [r["event"] for r in result.records]
    assert "early_stop" in events and result.step == 4 * (N_TRAIN // BATCH)  # epochs 0..3, stopped after 2 bad ones
    stop = next(r for r in result.records if r["event"] == "early_stop")
    assert stop["best_epoch"] == 1 and stop["best_val_accuracy"] == 0.5
    assert events[-1] == "restored_best"
    for k, v in result.model.state_dict().items():
        assert torch.equal(v, snapshots[1][k])


class _Calls(tr.Callback):
    """Writes each ``on_epoch_end`` it receives into a shared list; asks to stop at the epochs in ``stop_at``."""

    def __init__(self, name, calls, stop_at=()):
        self.name, self.calls, self.stop_at = name, calls, set(stop_at)

    def on_epoch_end(self, state, record):
        self.calls.append((self.name, state.epoch, state.step))
        return state.epoch in self.stop_at


def _tiny_run(callbacks, epochs=3):
    """A linear model on 8 random samples, batches of 4: 2 steps per epoch, a few milliseconds."""
    g = torch.Generator().manual_seed(0)
    ds = torch.utils.data.TensorDataset(torch.randn(8, 3, 2, 2, generator=g), torch.randint(0, 3, (8,), generator=g))

    def make(generator):
        return torch.utils.data.DataLoader(ds, batch_size=4, shuffle=True, generator=generator)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 3))
    cfg = tr.TrainConfig(epochs=epochs, log_every=100, progress=False, lr=0.01)
    return tr.train(model, make, cfg, callbacks=callbacks)


def test_every_epoch_end_callback_runs_after_one_asks_to_stop():
    """A callback asking to stop does not silence the ones after it: each gets its on_epoch_end of the epoch, in
    order, and only then the run stops (a short-circuiting ``any(...)`` would skip the later ones)."""
    calls = []
    result = _tiny_run([_Calls("first", calls), _Calls("stopper", calls, stop_at={1}), _Calls("last", calls)])
    assert calls == [("first", 0, 2), ("stopper", 0, 2), ("last", 0, 2),
                     ("first", 1, 4), ("stopper", 1, 4), ("last", 1, 4)]
    assert result.step == 4 and [r["event"] for r in result.records][-1] == "stopped_early"
    assert [r["epoch"] for r in result.records if r["event"] == "epoch"] == [0, 1]
    calls.clear()
    result = _tiny_run([_Calls("stopper", calls, stop_at={0}), _Calls("a", calls), _Calls("b", calls)])
    assert calls == [("stopper", 0, 2), ("a", 0, 2), ("b", 0, 2)] and result.step == 2


def test_a_stop_asked_at_the_last_epoch_is_no_early_stop():
    calls = []
    result = _tiny_run([_Calls("stopper", calls, stop_at={1}), _Calls("last", calls)], epochs=2)
    assert calls == [("stopper", 0, 2), ("last", 0, 2), ("stopper", 1, 4), ("last", 1, 4)]
    assert result.step == 4 and result.completed
    assert "stopped_early" not in [r["event"] for r in result.records]


def test_train_early_stopping_needs_validation(train_set):
    with pytest.raises(ValueError, match="early_stopping watches the validation accuracy"):
        tr.train(_model(), _loader_factory(train_set, 0), tr.TrainConfig(epochs=2, progress=False, early_stopping=1))
    with pytest.raises(ValueError, match="early_stopping is a patience"):
        tr.TrainConfig(early_stopping=0)


def _run(train_set, workers, cfg_kwargs, seed_model=0, on_step=None):
    cfg = tr.TrainConfig(steps=N_STEPS, lr=0.05, log_every=1, progress=False, seed=0, **cfg_kwargs)
    return tr.train(_model(seed_model), _loader_factory(train_set, workers), cfg, on_step=on_step)


_reference: dict[int, dict[str, torch.Tensor]] = {}


def _uninterrupted(train_set, workers):
    if workers not in _reference:
        result = _run(train_set, workers, {})
        assert result.step == N_STEPS and result.completed
        _reference[workers] = {k: v.detach().clone() for k, v in result.model.state_dict().items()}
    return _reference[workers]


@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.parametrize("k, how", [(7, "signal"), (5, "crash")])
def test_in_process_resume_is_exact(train_set, tmp_path, workers, k, how):
    """Interrupt at step k (mid-epoch by a signal, or a crash after a periodic checkpoint at an epoch end),
    resume from the checkpoint: the final weights equal those of an uninterrupted run, bit for bit."""
    reference = _uninterrupted(train_set, workers)
    ck = str(tmp_path / "ck.pt")
    if how == "signal":
        def on_step(step, loss):
            if step == k:
                os.kill(os.getpid(), signal.SIGUSR1)

        first = _run(train_set, workers, dict(ckpt_path=ck), on_step=on_step)
        assert first.stopped_by == "SIGUSR1" and not first.completed
        assert first.step == k
        assert first.records[-1] == {"event": "stopped", "signal": "SIGUSR1", "step": k}
    else:
        def on_step(step, loss):
            if step == k + 1:
                raise RuntimeError("simulated crash")

        with pytest.raises(RuntimeError, match="simulated crash"):
            _run(train_set, workers, dict(ckpt_path=ck, ckpt_every=k), on_step=on_step)
    state = torch.load(ck, weights_only=False)
    assert state["step"] == k
    per_epoch = N_TRAIN // BATCH
    assert (state["epoch"], state["batch_in_epoch"]) == ((k // per_epoch, k % per_epoch))

    second = _run(train_set, workers, dict(ckpt_path=ck, resume=True), seed_model=123)
    assert second.completed and second.step == N_STEPS
    assert second.records[0] == {"event": "resumed", "step": k, "epoch": k // per_epoch}
    assert [r["step"] for r in second.records if r["event"] == "train"] == list(range(k + 1, N_STEPS + 1))
    final = second.model.state_dict()
    assert final.keys() == reference.keys()
    for name, tensor in reference.items():
        assert torch.equal(final[name], tensor), name


def test_resume_differs_without_checkpoint_state(train_set):
    """Sanity check for the test above: a different seed gives different weights, so equality means something."""
    reference = _uninterrupted(train_set, 0)
    cfg = tr.TrainConfig(steps=N_STEPS, lr=0.05, log_every=100, progress=False, seed=1)
    other = tr.train(_model(0), _loader_factory(train_set, 0), cfg).model.state_dict()
    assert not all(torch.equal(other[n], t) for n, t in reference.items())


# --------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------

def _cli_env(cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DLO_DATA_DIR", "DSDIR", "DLO_DEVICE")}
    env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", DLO_CACHE_DIR=str(cache))
    return env


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "dlo", "train", *args]


@pytest.mark.parametrize("args, word", [
    (["--data-dir", "/does/not/exist"], "/does/not/exist"),
    (["--cudnn-benchmark", "--generated"], "GPU"),
    (["--batch-size", "0"], "batch-size"),
    (["--steps", "0"], "steps"),
    (["--resume"], "ckpt"),
    (["--lr", "0"], "lr"),
])
def test_cli_errors_in_process(args, word, capsys):
    assert training_cli.main([*args, "--no-progress"]) == 2
    captured = capsys.readouterr()
    line = one_line(captured.err)
    assert "error: " in line and word in line


def test_cli_resume_with_missing_checkpoint(tmp_path, capsys):
    ck = tmp_path / "missing.pt"
    rc = training_cli.main(["--generated", "--n-train", "16", "--width", "4", "--batch-size", "8", "--steps", "2",
                  "--no-progress", "--ckpt", str(ck), "--resume"])
    assert rc == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith("error: ") and "missing.pt" in line


@pytest.fixture()
def nothing_runs(monkeypatch):
    """Replaces loading the data and training: a test of a refused command line sees whether either started."""
    started: list[str] = []
    monkeypatch.setattr(training_cli, "train", lambda *a, **k: started.append("train"))
    monkeypatch.setattr(data, "cifar10", lambda *a, **k: started.append("data"))
    return started


CLI_TINY = ["--generated", "--n-train", "16", "--width", "4", "--batch-size", "8", "--steps", "2", "--no-progress"]


@pytest.mark.parametrize("args, words", [
    (["--log-every", "0"], ["--log-every", "0"]),
    (["--ckpt-every", "0", "--ckpt", "CK"], ["--ckpt-every", "0"]),
    (["--ckpt-every", "-5", "--ckpt", "CK"], ["--ckpt-every", "-5"]),
    (["--ckpt-every", "5"], ["--ckpt-every", "--ckpt"]),
    (["--workers", "-1"], ["--workers"]),
])
def test_cli_bad_numbers_are_refused_before_anything_runs(args, words, tmp_path, nothing_runs, capsys):
    args = [str(tmp_path / "ck.pt") if a == "CK" else a for a in args]
    assert training_cli.main([*CLI_TINY, *args]) == 2
    line = one_line(capsys.readouterr().err)
    assert "error: " in line and all(w in line for w in words), line
    assert nothing_runs == []


@pytest.mark.parametrize("flag", ["--ckpt", "--out", "--save-weights"])
@pytest.mark.parametrize("where", ["a folder", "under a file", "under /proc"])
def test_cli_unwritable_outputs_are_refused_before_anything_runs(flag, where, tmp_path, nothing_runs, capsys):
    (tmp_path / "a-file").write_text("x")
    path = {"a folder": tmp_path, "under a file": tmp_path / "a-file" / "sub" / "f.pt",
            "under /proc": Path("/proc/dlo-no-such-folder/f.pt")}[where]  # /proc: unwritable even for root
    assert training_cli.main([*CLI_TINY, flag, str(path)]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith("error: ") and flag in line and str(path) in line, line
    assert nothing_runs == []
    assert (tmp_path / "a-file").read_text() == "x"


def test_cli_read_only_folder_is_refused_before_anything_runs(nothing_runs, as_unprivileged):
    """A folder the user cannot write: refused up front in one line (as 'nobody' when the tests run as root)."""
    import io
    import shutil
    import tempfile
    from contextlib import redirect_stderr

    base = Path(tempfile.mkdtemp(prefix="dlo-ro-"))  # outside pytest's root-only tmp folder, so nobody can enter
    try:
        base.chmod(0o755)
        (base / "ro").mkdir(mode=0o555)
        (base / "ro").chmod(0o555)
        (base / "rw").mkdir()
        (base / "rw").chmod(0o777)

        def run(folder):
            def fn():
                err = io.StringIO()
                with redirect_stderr(err):
                    rc = training_cli.main([*CLI_TINY, "--out", str(base / folder / "out.json"), "--resume",
                                            "--ckpt", str(base / "rw" / "missing.pt")])
                return [rc, err.getvalue()]
            return as_unprivileged(fn)

        rc, err = run("ro")
        line = one_line(err)
        assert rc == 2 and "--out" in line and "cannot write" in line and str(base / "ro") in line, line
        rc, err = run("rw")  # the control: the same user may write a writable folder (it then fails on --resume)
        line = one_line(err)
        assert rc == 2 and "missing.pt" in line and "cannot write" not in line, line
        assert nothing_runs == []
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("content", ["empty", "random bytes", "truncated"])
def test_cli_resume_of_a_damaged_checkpoint_is_one_line(content, tmp_path, nothing_runs, capsys):
    ck = tmp_path / "ck.pt"
    if content == "truncated":
        good = tr.save_checkpoint(ck, model=resnet18_cifar(width=4)).read_bytes()
        ck.write_bytes(good[: len(good) * 2 // 3])
    else:
        ck.write_bytes(b"" if content == "empty" else np.random.default_rng(0).bytes(5000))
    assert training_cli.main([*CLI_TINY, "--ckpt", str(ck), "--resume"]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith("error: ") and str(ck) in line, line
    assert nothing_runs == []


def test_cli_resume_with_other_options_is_refused_naming_them(tmp_path, capsys):
    ck = tmp_path / "ck.pt"
    assert training_cli.main([*CLI_TINY, "--ckpt", str(ck)]) == 0
    capsys.readouterr()
    calls: list[int] = []
    real_train = training_cli.train

    def counting_train(*a, **k):
        calls.append(1)
        return real_train(*a, **k)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(training_cli, "train", counting_train)
        assert training_cli.main([*CLI_TINY, "--ckpt", str(ck), "--resume", "--width", "8"]) == 2
        line = one_line(capsys.readouterr().err)
        assert "another model shape" in line and "--width" in line, line
        assert training_cli.main([*CLI_TINY, "--ckpt", str(ck), "--resume", "--batch-size", "4", "--seed", "1",
                                  "--lr", "0.1"]) == 2
        line = one_line(capsys.readouterr().err)
        for part in ("--batch-size 8 then, 4 now", "--seed 0 then, 1 now", "--lr 0.05 then, 0.1 now"):
            assert part in line, line
        assert calls == []
        assert training_cli.main([*CLI_TINY, "--ckpt", str(ck), "--resume"]) == 0  # the same options: resumed
        assert calls == [1]


def test_cli_sigterm_without_ckpt_says_nothing_was_saved(monkeypatch, capsys):
    real_train = training_cli.train

    def train_then_sigterm(*a, on_step=None, **k):
        def step_hook(step, loss):
            on_step(step, loss)
            if step == 1:
                os.kill(os.getpid(), signal.SIGTERM)
        return real_train(*a, on_step=step_hook, **k)

    monkeypatch.setattr(training_cli, "train", train_then_sigterm)
    assert training_cli.main([*CLI_TINY, "--steps", "6", "--log-every", "1"]) == 0
    out = capsys.readouterr().out
    stop = next(line for line in out.splitlines() if line.startswith("stopped by SIGTERM"))
    assert "nothing was saved" in stop and "--resume" not in stop, stop


def test_cli_error_subprocess_exit_code(tmp_path):
    proc = subprocess.run(_cli("--data-dir", "/does/not/exist", "--no-progress"), env=_cli_env(tmp_path / "cache"),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    line = one_line(proc.stderr)
    assert line.startswith("error: ") and "/does/not/exist" in line


def _start_reader(proc, lines: list[str]) -> threading.Thread:
    def read():
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))

    t = threading.Thread(target=read, daemon=True)
    t.start()
    return t


def _generate_cli_data(cache: Path) -> None:
    """The CLI's generated data (128 train images), made once before runs start in parallel."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(paths, "CACHE_DIR", cache)
        data.cifar10("train", generated=True, n_train=128, verbose=False)


CLI_COMMON = ["--generated", "--n-train", "128", "--width", "4", "--batch-size", "8", "--steps", "40",
              "--log-every", "1", "--no-progress", "--seed", "0"]


def _run_and_kill(cmd: list[str], env: dict[str, str], group: bool, at_step: int = 10) -> tuple[int, list[str]]:
    """Start ``cmd``, SIGTERM it (or its whole process group) once it printed ``step {at_step}``, wait."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=group)
    lines: list[str] = []
    reader = _start_reader(proc, lines)
    try:
        deadline = time.monotonic() + 120
        while not any(line.startswith(f"step {at_step} ") for line in lines):
            assert proc.poll() is None, "\n".join(lines)
            assert time.monotonic() < deadline, "\n".join(lines)
            time.sleep(0.01)
        if group:
            os.killpg(proc.pid, signal.SIGTERM)
        else:
            proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(timeout=10)
    return rc, lines


def test_cli_sigterm_to_process_group_with_workers(tmp_path):
    """Slurm (scancel, preemption, time limit) signals every process of the step, DataLoader workers included:
    a worker killed by SIGTERM must not take the run down before it has saved its checkpoint."""
    cache = tmp_path / "cache"
    _generate_cli_data(cache)
    ck = tmp_path / "ck.pt"
    rc, lines = _run_and_kill(_cli(*CLI_COMMON, "--workers", "1", "--ckpt", str(ck)), _cli_env(cache), group=True)
    out = "\n".join(lines)
    assert rc == 0, out
    assert "stopped by SIGTERM" in out and "error" not in out, out
    assert 10 <= torch.load(ck, weights_only=False)["step"] < 40


def test_cli_kill_and_resume_is_exact(tmp_path):
    """The acceptance test: SIGTERM a running `python -m dlo train`, resume it, compare with a run never stopped."""
    cache = tmp_path / "cache"
    _generate_cli_data(cache)
    env = _cli_env(cache)
    common = CLI_COMMON
    ck, ck_full = tmp_path / "ck.pt", tmp_path / "full" / "ck.pt"
    a, b, c = tmp_path / "A.pt", tmp_path / "B.pt", tmp_path / "C.pt"

    # The uninterrupted reference runs meanwhile, on the other core.
    full = subprocess.Popen(_cli(*common, "--ckpt", str(ck_full), "--save-weights", str(c),
                                 "--out", str(tmp_path / "full.json")),
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        rc, lines = _run_and_kill(_cli(*common, "--ckpt", str(ck), "--save-weights", str(a),
                                       "--out", str(tmp_path / "killed.json")), env, group=False)
        out = "\n".join(lines)
        assert rc == 0, out
        assert "stopped by SIGTERM" in out, out
        state = torch.load(ck, weights_only=False)
        assert 10 <= state["step"] < 40, state["step"]
        stop_line = next(line for line in lines if line.startswith("stopped by SIGTERM"))
        assert f"at step {state['step']};" in stop_line
        killed = json.loads((tmp_path / "killed.json").read_text())
        assert killed["stopped_by"] == "SIGTERM" and killed["step"] == state["step"]
        assert killed["records"][-1] == {"event": "stopped", "signal": "SIGTERM", "step": state["step"]}
        weights_a = torch.load(a, weights_only=True)
        _assert_state_equal(weights_a, state["model"])  # the weights saved on stop are the checkpoint's

        resumed = subprocess.run(_cli(*common, "--ckpt", str(ck), "--resume", "--save-weights", str(b),
                                      "--out", str(tmp_path / "resumed.json")),
                                 env=env, capture_output=True, text=True, timeout=300)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        steps = [int(line.split()[1]) for line in resumed.stdout.splitlines() if line.startswith("step ")]
        assert steps == list(range(state["step"] + 1, 41))
        rec = json.loads((tmp_path / "resumed.json").read_text())
        assert rec["step"] == 40 and rec["stopped_by"] is None
        assert rec["records"][0] == {"event": "resumed", "step": state["step"], "epoch": state["epoch"]}
        assert rec["env"]["device"] == "cpu" and rec["args"]["resume"] is True
        assert "generated" in rec["dataset"]

        full_out, full_err = full.communicate(timeout=300)
        assert full.returncode == 0, full_out + full_err
        assert json.loads((tmp_path / "full.json").read_text())["step"] == 40
        weights_b, weights_c = torch.load(b, weights_only=True), torch.load(c, weights_only=True)
        assert weights_b.keys() == weights_c.keys()
        for name in weights_c:
            assert torch.equal(weights_b[name], weights_c[name]), name
        assert not all(torch.equal(weights_a[n], weights_c[n]) for n in weights_c)  # A stopped early: it differs
    finally:
        if full.poll() is None:  # a failure above: do not leave the reference run behind
            full.kill()
            full.communicate()


class _WorkerProbe(torch.utils.data.Dataset):
    """What a DataLoader worker sees: its SIGTERM / SIGUSR1 dispositions and whether the user's init ran."""

    def __len__(self):
        return 2

    def __getitem__(self, i):
        return torch.tensor([signal.getsignal(signal.SIGTERM) == signal.SIG_IGN,
                             signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN,
                             os.environ.get("DLO_TEST_USER_INIT") == "1"])


def _user_init(worker_id):
    os.environ["DLO_TEST_USER_INIT"] = "1"


def test_loader_workers_ignore_stop_signals_and_keep_user_init():
    made = []

    def make_loader(generator):
        loader = torch.utils.data.DataLoader(_WorkerProbe(), batch_size=2, num_workers=1, generator=generator,
                                             worker_init_fn=_user_init)
        made.append(loader)
        return loader

    it, n = dlo.training.loop._iter_epoch(make_loader, seed=0, epoch=0, skip=0)
    (flags,) = list(it)
    assert n == 1
    assert flags.tolist() == [[True, True, True], [True, True, True]]
    assert signal.getsignal(signal.SIGTERM) != signal.SIG_IGN  # the main process is untouched
    it2, _ = dlo.training.loop._iter_epoch(lambda g: made[0], seed=0, epoch=1, skip=0)  # a reused loader is not wrapped twice
    assert made[0].worker_init_fn.init is _user_init
    list(it2)


def test_resume_with_a_different_length_is_refused_in_one_line(tmp_path):
    """The one-cycle schedule depends on the run's length: resuming a 6-step run as a 9-step one is refused."""
    from dlo import data
    from dlo.models import resnet18_cifar
    from dlo.training import TrainConfig, train

    ds = data.cifar10("train", None, data.test_transform(), generated=True, n_train=64, n_test=64, verbose=False)

    def make_loader(g):
        return data.make_loader(ds, 16, shuffle=True, drop_last=True, generator=g)

    ck = tmp_path / "ck.pt"
    train(resnet18_cifar(width=4), make_loader, TrainConfig(steps=6, ckpt_path=str(ck), progress=False))
    with pytest.raises(ValueError, match="belongs to a run of 6 steps, this one has 9"):
        train(resnet18_cifar(width=4), make_loader, TrainConfig(steps=9, ckpt_path=str(ck), resume=True, progress=False))


# --------------------------------------------------------------------------------------------------
# Gradient accumulation and early stopping
# --------------------------------------------------------------------------------------------------

def _grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def _accum_grads(model, x, y, k):
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: the step leaves weights, grads stay readable
    tr.make_train_step(model, opt, nn.CrossEntropyLoss(), CPU, accum_steps=k)(x, y)
    return _grads(model)


@pytest.mark.parametrize("k", [2, 4, 3])  # 3 does not divide 32: micro-batches weighted by their size
def test_accumulation_gives_the_big_batch_gradient(k):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 8 * 8, 10))
    x, y = torch.randn(32, 3, 8, 8), torch.randint(0, 10, (32,))
    big = _accum_grads(model, x, y, 1)
    small = _accum_grads(model, x, y, k)
    for name in big:
        torch.testing.assert_close(small[name], big[name], rtol=1e-5, atol=1e-6)


def test_accumulation_with_batchnorm_is_close_but_not_equal():
    """BatchNorm normalises each micro-batch with its own statistics: not the big batch's gradient."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                          nn.Linear(4 * 8 * 8, 10))
    x, y = torch.randn(32, 3, 8, 8), torch.randint(0, 10, (32,))
    big, small = _accum_grads(model, x, y, 1), _accum_grads(model, x, y, 4)
    diff = max((small[n] - big[n]).abs().max().item() for n in big)
    assert diff > 1e-4  # really different...
    assert all(torch.allclose(small[n], big[n], rtol=0.5, atol=0.05) for n in big)  # ...but the same ballpark


def test_accumulation_rejects_bad_values():
    model = nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="accum_steps must be a positive integer"):
        tr.make_train_step(model, opt, nn.CrossEntropyLoss(), CPU, accum_steps=0)
    step = tr.make_train_step(model, opt, nn.CrossEntropyLoss(), CPU, accum_steps=5)
    with pytest.raises(ValueError, match="more than the batch of 4"):
        step(torch.randn(4, 2), torch.randint(0, 2, (4,)))


@pytest.mark.parametrize("to_disk", [False, True])
def test_early_stopping_stops_after_patience_and_restores_the_best(tmp_path, to_disk):
    model = nn.Linear(3, 2)
    es = tr.EarlyStopping(patience=2, mode="max", path=tmp_path / "best.pt" if to_disk else None)
    stops, snapshots = [], []
    for metric in [0.50, 0.60, 0.55, 0.58, 0.70]:
        with torch.no_grad():
            model.weight.add_(1.0)  # the weights change every "epoch"
        snapshots.append({k: v.clone() for k, v in model.state_dict().items()})
        stops.append(es.step(metric, model))
        if stops[-1]:
            break
    assert stops == [False, False, False, True]  # 0.55 and 0.58 do not beat 0.60: stop after 2 bad epochs
    assert es.best == 0.60 and es.best_index == 1
    es.restore_best(model)
    for k, v in model.state_dict().items():
        assert torch.equal(v, snapshots[1][k])


def test_early_stopping_min_mode_min_delta_and_errors():
    model = nn.Linear(2, 2)
    es = tr.EarlyStopping(patience=1, mode="min", min_delta=0.1)
    assert es.step(1.0, model) is False
    assert es.step(0.95, model) is True  # improved by less than min_delta: does not count
    with pytest.raises(ValueError, match="patience must be a positive integer"):
        tr.EarlyStopping(patience=0)
    with pytest.raises(ValueError, match="mode must be 'max'"):
        tr.EarlyStopping(mode="up")
    with pytest.raises(RuntimeError, match="before any step"):
        tr.EarlyStopping().restore_best(model)


def test_cli_a_full_disk_while_checkpointing_is_one_line_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch,
                                                                                          capsys):
    """The disk holds one checkpoint but not two: the second save fails. `dlo train` ends with the atomic writer's
    one line (no traceback), exit code 1, and the first checkpoint is still there, whole."""
    import errno

    from dlo.training import checkpoint as ckpt_module
    from dlo.training import cli as training_cli

    ck = tmp_path / "run.pt"
    real, calls = ckpt_module.atomic_write, []

    def fills_up(path, write, **kw):
        calls.append(path)
        if len(calls) > 1:
            raise OSError(errno.ENOSPC, f"no space left on {path} (its file system has 0 bytes free): its previous "
                                        "content is kept; free some space and write it again")
        return real(path, write, **kw)

    monkeypatch.setattr(ckpt_module, "atomic_write", fills_up)
    rc = training_cli.main([*CLI_TINY, "--ckpt", str(ck), "--ckpt-every", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(calls) == 2, (rc, calls)
    assert err == [f"error: [Errno 28] no space left on {ck} (its file system has 0 bytes free): its previous content "
                   "is kept; free some space and write it again"], err
    assert ckpt_module.read_checkpoint(ck)["step"] == 1
