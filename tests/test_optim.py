"""Tests of dlo.training.optim: the hand-written optimisers against updates computed by hand, state_dict round trips,
the optimiser and schedule factories with their errors, the linear scaling rule, and the learning-rate range
test, above all that it leaves the model, the optimiser and the RNGs exactly as it found them.

Everything runs on the CPU on tensors of a few dozen numbers and models of a few hundred parameters.
"""
from __future__ import annotations

import copy
import io
import json
import warnings

import matplotlib
import pytest
import torch
from torch import nn

import dlo  # noqa: F401  (before torchvision: prepares its import)
from dlo.training import optim as O
from dlo.lessons import lr_find

matplotlib.use("Agg")


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One intra-op thread: the tensors are tiny, and two threads on 2 shared cores only wait on each other."""
    from dlo.measure.records import torch_threads

    with torch_threads(1):
        yield


def one_line(text: str) -> str:
    assert text and "\n" not in text.strip(), f"expected one line: {text!r}"
    return text.strip()


def close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------------------------------
# Hand-written optimisers against the formulas, computed here with plain tensor math
# --------------------------------------------------------------------------------------------------

def tensors():
    """A 2x3 weight and a bias (float64: the comparison tolerance can then be tiny), and gradients for 2 steps."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(2, 3, generator=g, dtype=torch.float64)
    b = torch.randn(2, generator=g, dtype=torch.float64)
    grads = [(torch.randn(2, 3, generator=g, dtype=torch.float64), torch.randn(2, generator=g, dtype=torch.float64))
             for _ in range(2)]
    return w, b, grads


def run_steps(opt_factory, steps: int, **group_kw):
    """Parameters ``w`` (adapt group, with ``group_kw``) and ``b`` (``"adapt": False``, no decay) after ``steps``
    optimiser steps with the fixed gradients; returns them and the optimiser."""
    w0, b0, grads = tensors()
    w, b = w0.clone().requires_grad_(), b0.clone().requires_grad_()
    opt = opt_factory([{"params": [w], **group_kw}, {"params": [b], "weight_decay": 0.0, "adapt": False}])
    for gw, gb in grads[:steps]:
        w.grad, b.grad = gw.clone(), gb.clone()
        opt.step()
    return w.detach(), b.detach(), opt


def norm(t):
    return torch.sqrt((t * t).sum())


def test_lion_matches_the_formula():
    lr, (b1, b2), wd = 0.01, (0.9, 0.99), 0.1
    w0, b0, grads = tensors()
    for steps in (1, 2):
        w, b, opt = run_steps(lambda groups: O.Lion(groups, lr=lr, betas=(b1, b2)), steps, weight_decay=wd)
        ew, eb = w0.clone(), b0.clone()
        mw, mb = torch.zeros_like(ew), torch.zeros_like(eb)
        for gw, gb in grads[:steps]:
            ew = ew * (1 - lr * wd) - lr * torch.sign(b1 * mw + (1 - b1) * gw)
            eb = eb - lr * torch.sign(b1 * mb + (1 - b1) * gb)  # this group has weight_decay 0
            mw, mb = b2 * mw + (1 - b2) * gw, b2 * mb + (1 - b2) * gb
        close(w, ew)
        close(b, eb)
        close(opt.state[opt.param_groups[0]["params"][0]]["exp_avg"], mw)
        close(opt.state[opt.param_groups[1]["params"][0]]["exp_avg"], mb)
    # every coordinate moved by exactly lr (plus the decay): the sign throws the magnitude away
    w1, _, _ = run_steps(lambda groups: O.Lion(groups, lr=lr), 1)
    close((w1 - w0).abs(), torch.full_like(w0, lr))


@pytest.mark.parametrize("nesterov", [False, True])
def test_lars_matches_the_formula(nesterov):
    lr, mu, wd, eta, eps = 0.5, 0.9, 0.01, 0.02, 1e-8
    w0, b0, grads = tensors()
    for steps in (1, 2):
        w, b, opt = run_steps(lambda groups: O.LARS(groups, lr=lr, momentum=mu, trust_coefficient=eta, eps=eps,
                                                    nesterov=nesterov), steps, weight_decay=wd)
        ew, eb = w0.clone(), b0.clone()
        bw, bb = torch.zeros_like(ew), torch.zeros_like(eb)
        for gw, gb in grads[:steps]:
            d = gw + wd * ew
            trust = eta * norm(ew) / (norm(gw) + wd * norm(ew) + eps)  # the paper's denominator
            bw = mu * bw + trust * d
            ew = ew - lr * ((trust * d + mu * bw) if nesterov else bw)
            bb = mu * bb + gb  # "adapt": False: no trust ratio, no weight decay
            eb = eb - lr * ((gb + mu * bb) if nesterov else bb)
        close(w, ew)
        close(b, eb)
        close(opt.state[opt.param_groups[0]["params"][0]]["momentum_buffer"], bw)
        close(opt.state[opt.param_groups[1]["params"][0]]["momentum_buffer"], bb)


def test_lars_trust_ratio_follows_the_paper():
    """You et al. 2017 (and timm, pytorch-optimizer): eta * ||w|| / (||g|| + wd * ||w||), not
    eta * ||w|| / ||g + wd * w||. With w = (3, 4), g = (0, -0.5), wd = 0.1, eta = 0.01:
    ||w|| = 5, ||g|| = 0.5, so trust = 0.01 * 5 / (0.5 + 0.1 * 5) = 0.05 (the other formula: 0.158);
    d = g + wd * w = (0.3, -0.1) and, with lr 1 and no momentum, w becomes w - 0.05 * d = (2.985, 4.005)."""
    w = torch.tensor([3.0, 4.0], dtype=torch.float64, requires_grad=True)
    opt = O.LARS([w], lr=1.0, momentum=0.0, weight_decay=0.1, trust_coefficient=0.01, eps=0.0)
    w.grad = torch.tensor([0.0, -0.5], dtype=torch.float64)
    opt.step()
    close(w.detach(), torch.tensor([2.985, 4.005], dtype=torch.float64))


def test_lars_trust_ratio_is_one_for_zero_weights_and_adapt_false_ignores_weight_decay():
    w = torch.zeros(2, 3, dtype=torch.float64, requires_grad=True)  # ||p|| = 0: the ratio would freeze it
    b = torch.ones(2, dtype=torch.float64, requires_grad=True)
    opt = O.LARS([{"params": [w]}, {"params": [b], "adapt": False, "weight_decay": 0.5}], lr=0.1, momentum=0.0)
    w.grad, b.grad = torch.full_like(w, 2.0), torch.zeros_like(b)
    opt.step()
    close(w.detach(), torch.full_like(w, -0.2))
    close(b.detach(), torch.ones_like(b))  # zero gradient, and the group's weight decay is skipped
    assert not opt.state[w]  # momentum 0 keeps no buffer


def test_lamb_matches_the_formula():
    lr, (b1, b2), eps, wd = 0.01, (0.9, 0.999), 1e-6, 0.05
    w0, b0, grads = tensors()
    for steps in (1, 2):
        w, b, opt = run_steps(lambda groups: O.LAMB(groups, lr=lr, betas=(b1, b2), eps=eps), steps, weight_decay=wd)
        ew, eb = w0.clone(), b0.clone()
        mw, vw, mb, vb = torch.zeros_like(ew), torch.zeros_like(ew), torch.zeros_like(eb), torch.zeros_like(eb)
        for t, (gw, gb) in enumerate(grads[:steps], start=1):
            mw, vw = b1 * mw + (1 - b1) * gw, b2 * vw + (1 - b2) * gw * gw
            r = (mw / (1 - b1 ** t)) / (torch.sqrt(vw / (1 - b2 ** t)) + eps) + wd * ew
            ew = ew - lr * (norm(ew) / norm(r)) * r
            mb, vb = b1 * mb + (1 - b1) * gb, b2 * vb + (1 - b2) * gb * gb
            eb = eb - lr * (mb / (1 - b1 ** t)) / (torch.sqrt(vb / (1 - b2 ** t)) + eps)  # trust 1, no decay
        close(w, ew)
        close(b, eb)
        sw, sb = opt.state[opt.param_groups[0]["params"][0]], opt.state[opt.param_groups[1]["params"][0]]
        assert sw["step"] == sb["step"] == steps
        close(sw["exp_avg"], mw)
        close(sw["exp_avg_sq"], vw)
        close(sb["exp_avg"], mb)
        close(sb["exp_avg_sq"], vb)


def test_lamb_adapt_false_is_adam_with_bias_correction():
    """With trust 1 and no decay, LAMB is Adam (torch's, whose eps is also added outside the square root)."""
    w0, _, grads = tensors()
    w1, w2 = w0.clone().requires_grad_(), w0.clone().requires_grad_()
    lamb = O.LAMB([{"params": [w1], "adapt": False}], lr=0.01, eps=1e-8)
    adam = torch.optim.Adam([w2], lr=0.01, eps=1e-8)
    for gw, _ in grads:
        w1.grad, w2.grad = gw.clone(), gw.clone()
        lamb.step()
        adam.step()
    torch.testing.assert_close(w1, w2, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("cls, kw", [(O.Lion, {"lr": 0.01, "weight_decay": 0.1}),
                                     (O.LARS, {"lr": 0.5, "weight_decay": 0.01, "nesterov": True}),
                                     (O.LAMB, {"lr": 0.01, "weight_decay": 0.01})])
def test_state_dict_round_trip_is_bit_identical(cls, kw):
    """2 steps, save (through torch.save / torch.load(weights_only=True), like a checkpoint), a fresh optimiser
    loads it and does 3 more: the same bits as 5 steps in one go."""
    g = torch.Generator().manual_seed(1)
    w0, b0 = torch.randn(2, 3, generator=g), torch.randn(2, generator=g)
    data = [(torch.randn(4, 3, generator=g), torch.randn(4, 2, generator=g)) for _ in range(5)]

    def build(w, b):
        w, b = w.clone().requires_grad_(), b.clone().requires_grad_()
        return w, b, cls([{"params": [w]}, {"params": [b], "weight_decay": 0.0, "adapt": False}], **kw)

    def train(w, b, opt, batches):
        for x, y in batches:
            opt.zero_grad()
            ((x @ w.T + b - y) ** 2).mean().backward()
            opt.step()

    w, b, opt = build(w0, b0)
    train(w, b, opt, data)

    w2, b2, opt2 = build(w0, b0)
    train(w2, b2, opt2, data[:2])
    buf = io.BytesIO()
    torch.save({"w": w2.detach(), "b": b2.detach(), "opt": opt2.state_dict()}, buf)
    buf.seek(0)
    ckpt = torch.load(buf, weights_only=True)
    w3, b3, opt3 = build(ckpt["w"], ckpt["b"])
    opt3.load_state_dict(ckpt["opt"])
    train(w3, b3, opt3, data[2:])

    assert torch.equal(w, w3) and torch.equal(b, b3)
    for p, q in zip((w, b), (w3, b3)):
        for key, value in opt.state[p].items():
            other = opt3.state[q][key]
            assert torch.equal(value, other) if isinstance(value, torch.Tensor) else value == other


@pytest.mark.parametrize("make, match", [
    (lambda p: O.Lion(p, lr=-1.0), "learning rate"),
    (lambda p: O.Lion(p, betas=(0.9, 1.0)), "betas"),
    (lambda p: O.LAMB(p, eps=-1.0), "eps"),
    (lambda p: O.LAMB(p, betas=(1.2, 0.9)), "betas"),
    (lambda p: O.LARS(p, lr=1.0, momentum=1.0), "momentum"),
    (lambda p: O.LARS(p, lr=1.0, momentum=0.0, nesterov=True), "nesterov"),
    (lambda p: O.LARS(p, lr=float("nan")), "learning rate"),
])
def test_optimizer_constructors_validate(make, match):
    with pytest.raises(ValueError, match=match) as err:
        make([torch.zeros(2, requires_grad=True)])
    one_line(str(err.value))


# --------------------------------------------------------------------------------------------------
# param_groups / make_optimizer
# --------------------------------------------------------------------------------------------------

def small_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 3))


def toy_batches(n: int = 8, batch: int = 32, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A learnable 3-class problem: the label is the argmax of a fixed linear map of the input."""
    g = torch.Generator().manual_seed(seed)
    proj = torch.randn(8, 3, generator=g)
    out = []
    for _ in range(n):
        x = torch.randn(batch, 8, generator=g)
        out.append((x, (x @ proj).argmax(dim=1)))
    return out


def train_steps(model, opt, batches, steps: int):
    model.train()
    for i in range(steps):
        x, y = batches[i % len(batches)]
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def test_param_groups_exclude_biases_and_norms():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.LayerNorm(4), nn.Linear(4, 2))
    groups = O.param_groups(model, 0.05)
    decay, no_decay = groups
    assert (decay["weight_decay"], decay["adapt"], no_decay["weight_decay"], no_decay["adapt"]) == (0.05, True, 0.0, False)
    ids = lambda ps: {id(p) for p in ps}  # noqa: E731
    assert ids(decay["params"]) == ids([model[0].weight, model[4].weight])
    assert ids(no_decay["params"]) == ids([model[0].bias, model[1].weight, model[1].bias, model[3].weight,
                                           model[3].bias, model[4].bias])
    (everything,) = O.param_groups(model, 0.05, exclude_bias_and_norm=False)
    assert len(everything["params"]) == len(list(model.parameters())) and everything["weight_decay"] == 0.05
    # make_optimizer splits a model the same way, and the torch optimisers keep (and ignore) the 'adapt' key
    opt = O.make_optimizer("adamw", model, lr=1e-3, weight_decay=0.05)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.05, 0.0]
    assert [g["adapt"] for g in opt.param_groups] == [True, False]


@pytest.mark.parametrize("name", O.OPTIMIZERS)
def test_every_optimizer_builds_and_steps(name):
    model, batches = small_model(), toy_batches(2)
    before = [p.detach().clone() for p in model.parameters()]
    opt = O.make_optimizer(name, model, lr=0.01, weight_decay=1e-4)
    train_steps(model, opt, batches, 2)
    moved = [not torch.equal(a, p) for a, p in zip(before, model.parameters())]
    # every tensor moved, except perhaps the first layer's bias: BatchNorm subtracts the batch mean right after
    # it, so its gradient is 0 up to rounding (SGD barely moves it; Adam and Lion normalise the rounding noise)
    assert moved[:1] + moved[2:] == [True] * 5
    assert all(torch.isfinite(p).all() for p in model.parameters())
    # also from a plain list of tensors
    O.make_optimizer(name, list(model.parameters()), lr=0.01, betas=(0.8, 0.9))


def test_adam_l2_differs_from_adamw_only_with_weight_decay():
    def run(name, wd):
        model = small_model()
        opt = O.make_optimizer(name, model.parameters(), lr=0.01, weight_decay=wd)
        train_steps(model, opt, toy_batches(3), 3)
        return [p.detach() for p in model.parameters()]

    assert any(not torch.equal(a, b) for a, b in zip(run("adam_l2", 0.1), run("adamw", 0.1)))
    assert all(torch.equal(a, b) for a, b in zip(run("adam_l2", 0.0), run("adamw", 0.0)))


@pytest.mark.parametrize("kw, match", [
    ({"lr": 0}, "learning rate"), ({"lr": -1}, "learning rate"), ({"lr": float("inf")}, "learning rate"),
    ({"lr": 0.1, "betas": (0.9, 1.0)}, "betas"), ({"lr": 0.1, "betas": (1.2, 0.9)}, "betas"),
    ({"lr": 0.1, "betas": (0.9,)}, "betas"),
    ({"lr": 0.1, "momentum": 1.0}, "momentum"), ({"lr": 0.1, "momentum": -0.1}, "momentum"),
    ({"lr": 0.1, "weight_decay": -1e-4}, "weight_decay"),
    ({"lr": 0.1, "name": "adamx"}, "unknown optimizer 'adamx': use one of sgd, sgd_nesterov, adam_l2, adamw, lamb"),
    ({"lr": 0.1, "name": "sgd_nesterov", "momentum": 0.0}, "momentum > 0"),
])
def test_make_optimizer_errors(kw, match):
    name = kw.pop("name", "adamw")
    with pytest.raises(ValueError, match=match) as err:
        O.make_optimizer(name, small_model(), **kw)
    one_line(str(err.value))


# --------------------------------------------------------------------------------------------------
# Schedules
# --------------------------------------------------------------------------------------------------

def sgd(lr: float = 0.1, momentum: float = 0.9):
    return torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=lr, momentum=momentum)


@pytest.mark.parametrize("name", O.SCHEDULES)
def test_every_schedule_runs_total_steps_quietly(name):
    opt = sgd()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scheduler = O.make_scheduler(name, opt, 20, warmup_steps=0 if name == "cyclic" else 4)
        lrs = []
        for _ in range(20):
            lrs.append(opt.param_groups[0]["lr"])
            opt.step()
            scheduler.step()
    # stepping 20 times is allowed (OneCycleLR raises past total_steps), in the right order
    assert not [w for w in caught if "optimizer.step()" in str(w.message)]
    assert all(0 <= lr <= 0.1 + 1e-12 for lr in lrs)
    assert lrs == O.schedule_values(name, 20, lr=0.1, warmup_steps=0 if name == "cyclic" else 4)


def test_warmup_cosine_rises_linearly_then_decays_to_zero():
    lr, warm, total = 0.4, 5, 50
    values = O.schedule_values("warmup_cosine", total, lr=lr, warmup_steps=warm)
    assert values[:warm] == pytest.approx([lr * (i + 1) / warm for i in range(warm)], rel=1e-9)
    assert values[warm] == pytest.approx(lr)
    assert all(a >= b for a, b in zip(values[warm:], values[warm + 1:]))
    assert values[-1] < 1e-2 * lr
    assert O.schedule_values("warmup_cosine", total, lr=lr)[0] == pytest.approx(lr)  # no warm-up: cosine alone


def test_onecycle_peaks_at_the_optimizer_lr():
    values = O.schedule_values("onecycle", 40, lr=0.3)
    assert max(values) == pytest.approx(0.3)
    assert values[0] == pytest.approx(0.3 / 25) and values[-1] < 1e-3 * 0.3
    with_warmup = O.schedule_values("onecycle", 40, lr=0.3, warmup_steps=10)
    assert with_warmup.index(max(with_warmup)) == 9


def test_step_and_constant_schedules():
    assert O.schedule_values("constant", 5, lr=0.2) == [0.2] * 5
    values = O.schedule_values("step", 9, lr=1.0)
    assert values == pytest.approx([1.0] * 3 + [0.1] * 3 + [0.01] * 3)


def test_cyclic_works_on_adam_and_cycles_sgd_momentum():
    model = small_model()
    opt = O.make_optimizer("adamw", model, lr=0.01)
    scheduler = O.make_scheduler("cyclic", opt, 16)
    lrs = []
    for x, y in toy_batches(16, batch=8):
        lrs.append(opt.param_groups[0]["lr"])
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        scheduler.step()
    assert min(lrs) == pytest.approx(0.001) and max(lrs) == pytest.approx(0.01)
    assert all(g["betas"] == (0.9, 0.999) for g in opt.param_groups)  # Adam's betas are left alone
    opt = sgd(momentum=0.9)
    O.make_scheduler("cyclic", opt, 16)
    assert opt.param_groups[0]["momentum"] == pytest.approx(0.9)  # starts at the low lr, so the high momentum
    assert opt.param_groups[0]["base_momentum"] == pytest.approx(0.8)
    O.make_scheduler("cyclic", sgd(momentum=0.0), 16)  # plain SGD: momentum is not switched on behind your back


@pytest.mark.parametrize("name, betas", [("lion", (0.9, 0.99)), ("lamb", (0.9, 0.999)), ("adamw", (0.9, 0.999)),
                                         ("adam_l2", (0.9, 0.999))])
def test_onecycle_leaves_the_betas_alone(name, betas):
    """OneCycleLR's cycle_momentum would set beta1 to 0.95 at once and cycle it to 0.85: Lion's beta1 is
    not a momentum at all. The betas the optimiser was built with stay as they are, at every step."""
    opt = O.make_optimizer(name, small_model(), lr=0.01)
    scheduler = O.make_scheduler("onecycle", opt, 10)
    seen = set()
    for _ in range(10):
        seen.update(tuple(g["betas"]) for g in opt.param_groups)
        opt.step()
        scheduler.step()
    assert seen == {betas}
    # asked for explicitly, beta1 is cycled
    opt = O.make_optimizer(name, small_model(), lr=0.01)
    O.make_scheduler("onecycle", opt, 10, cycle_momentum=True)
    assert opt.param_groups[0]["betas"][0] == pytest.approx(0.95)


@pytest.mark.parametrize("name", ["sgd", "lars"])
def test_onecycle_cycles_the_momentum_of_momentum_optimizers(name):
    opt = O.make_optimizer(name, small_model(), lr=0.1, momentum=0.9)
    scheduler = O.make_scheduler("onecycle", opt, 10, pct_start=0.5)
    moms = []
    for _ in range(10):
        moms.append(opt.param_groups[0]["momentum"])
        opt.step()
        scheduler.step()
    assert moms[0] == pytest.approx(0.95) and min(moms) == pytest.approx(0.85)
    opt = O.make_optimizer("sgd", small_model(), lr=0.1, momentum=0.0)
    O.make_scheduler("onecycle", opt, 10)
    assert opt.param_groups[0]["momentum"] == 0.0  # plain SGD: momentum is not switched on behind your back


@pytest.mark.parametrize("args, kw, match", [
    (("cosine", 10), {}, "unknown schedule 'cosine': use one of constant, step, cyclic, onecycle, warmup_cosine"),
    (("constant", 0), {}, "total_steps"), (("step", -5), {}, "total_steps"),
    (("warmup_cosine", 10), {"warmup_steps": 10}, "warmup_steps"),
    (("warmup_cosine", 10), {"warmup_steps": -1}, "warmup_steps"),
    (("cyclic", 10), {"warmup_steps": 2}, "no warm-up"),
])
def test_make_scheduler_errors(args, kw, match):
    name, total = args
    with pytest.raises(ValueError, match=match) as err:
        O.make_scheduler(name, sgd(), total, **kw)
    one_line(str(err.value))


def test_plot_schedules(tmp_path):
    from matplotlib.figure import Figure

    fig = O.plot_schedules(O.SCHEDULES, 30, lr=0.1, warmup_steps=3, path=tmp_path / "s.png")
    assert isinstance(fig, Figure) and (tmp_path / "s.png").stat().st_size > 0
    assert len(fig.axes[0].lines) == len(O.SCHEDULES)


def test_scaled_lr():
    assert O.scaled_lr(0.1, 256) == pytest.approx(0.1)
    assert O.scaled_lr(0.1, 1024) == pytest.approx(0.4)
    assert O.scaled_lr(0.1, 64, base_batch=128) == pytest.approx(0.05)
    for bad in ((0.1, 0), (0.1, 32, 0), (0.0, 32)):
        with pytest.raises(ValueError):
            O.scaled_lr(*bad)


# --------------------------------------------------------------------------------------------------
# lr_find
# --------------------------------------------------------------------------------------------------

def warmed_up(seed: int = 0, name: str = "sgd"):
    """A model with BatchNorm and dropout, and an optimiser (with momentum buffers) that has taken 3 steps."""
    model = small_model(seed)
    opt = O.make_optimizer(name, model, lr=0.05, weight_decay=1e-4)
    train_steps(model, opt, toy_batches(3), 3)
    return model, opt


def snapshot(model, opt):
    return {"state": {k: v.clone() for k, v in model.state_dict().items()},
            "grads": [None if p.grad is None else p.grad.clone() for p in model.parameters()],
            "opt": copy.deepcopy(opt.state_dict()),
            "lrs": [g["lr"] for g in opt.param_groups],
            "modes": [m.training for m in model.modules()],
            "rng": torch.get_rng_state()}


def assert_same(a, b, where="root"):
    """Recursive equality, bit for bit on tensors."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def assert_restored(before, model, opt):
    assert_same(before, snapshot(model, opt))
    assert opt.param_groups[0]["params"][0] is model[0].weight  # same tensors, not copies


@pytest.mark.parametrize("name", ["sgd", "adamw"])
def test_lr_find_restores_everything_and_training_continues_identically(name):
    model, opt = warmed_up(name=name)
    model[1].eval()  # a frozen BatchNorm inside a model in train mode: modes are restored per module
    assert opt.state_dict()["state"], "the optimiser must have state (momentum buffers / moments) already"
    before = snapshot(model, opt)
    result = lr_find.lr_find(model, opt, nn.functional.cross_entropy, toy_batches(5), start_lr=1e-5, end_lr=1.0,
                       num_steps=30)
    assert_restored(before, model, opt)
    assert len(result.lrs) == len(result.losses) == len(result.smoothed) >= 5

    # the same training afterwards as without the test (dropout draws the same masks: RNG restored)
    twin, twin_opt = warmed_up(name=name)
    twin[1].eval()
    for m, o in ((model, opt), (twin, twin_opt)):
        torch.manual_seed(7)
        x, y = toy_batches(1, seed=3)[0]
        for _ in range(2):
            o.zero_grad()
            nn.functional.cross_entropy(m(x), y).backward()
            o.step()
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), twin.state_dict().values()))


def test_lr_find_result_sweep_and_suggestion(tmp_path):
    model, opt = warmed_up()
    model.eval()
    result = lr_find.lr_find(model, opt, nn.functional.cross_entropy, toy_batches(4), start_lr=1e-4, end_lr=10.0,
                       num_steps=40, diverge_factor=1e9)  # never stop: the whole exponential grid is visible
    assert not model.training
    assert len(result.lrs) == 40 and not result.stopped_early and result.divergence_lr is None
    expected = [1e-4 * (10.0 / 1e-4) ** (i / 39) for i in range(40)]
    assert result.lrs == pytest.approx(expected, rel=1e-12)
    assert result.smoothed[0] == pytest.approx(result.losses[0])  # bias correction: the first point is the loss
    low, high = result.suggested_range
    assert 1e-4 <= low <= high <= 10.0
    assert 1e-4 <= result.steepest_lr <= 10.0 and result.min_loss_lr in result.lrs
    assert min(result.smoothed) < result.smoothed[0]  # the toy problem is learnable: the loss did fall
    json.dumps(result.to_dict())
    fig = result.plot(tmp_path / "lr.png")
    assert (tmp_path / "lr.png").stat().st_size > 0 and fig.axes[0].get_xscale() == "log"


def test_lr_find_stops_on_divergence_and_restores():
    model, opt = warmed_up()
    before = snapshot(model, opt)
    result = lr_find.lr_find(model, opt, nn.functional.cross_entropy, toy_batches(4), start_lr=1e-3, end_lr=1e6,
                       num_steps=100)
    assert result.stopped_early and len(result.lrs) < 100
    assert result.divergence_lr is not None and result.divergence_lr >= result.lrs[-1]
    assert result.start_lr <= result.suggested_range[0] <= result.suggested_range[1] <= result.divergence_lr
    assert_restored(before, model, opt)
    result.plot()


def test_lr_find_restores_when_the_criterion_raises_midway():
    model, opt = warmed_up()
    before = snapshot(model, opt)
    calls = []

    def criterion(out, y):
        calls.append(1)
        if len(calls) == 5:
            raise RuntimeError("boom at step 5")
        return nn.functional.cross_entropy(out, y)

    with pytest.raises(RuntimeError, match="boom at step 5"):
        lr_find.lr_find(model, opt, criterion, toy_batches(4), num_steps=20)
    assert_restored(before, model, opt)


def test_lr_find_cycles_short_batches_and_accepts_a_step_fn():
    from dlo.training import make_train_step

    model, opt = warmed_up()
    before = snapshot(model, opt)
    step = make_train_step(model, opt, nn.functional.cross_entropy, torch.device("cpu"))
    result = lr_find.lr_find(model, opt, None, toy_batches(2), num_steps=12, start_lr=1e-4, end_lr=1e-1, step_fn=step)
    assert len(result.lrs) == 12
    assert_restored(before, model, opt)
    # a one-shot generator that runs out cannot be replayed: a clear error, and still restored
    with pytest.raises(ValueError, match="ran out") as err:
        lr_find.lr_find(model, opt, nn.functional.cross_entropy, (b for b in toy_batches(3)), num_steps=10)
    one_line(str(err.value))
    assert_restored(before, model, opt)


@pytest.mark.parametrize("kw, match", [
    ({"start_lr": 1.0, "end_lr": 1.0}, "start_lr < end_lr"), ({"start_lr": 1.0, "end_lr": 0.1}, "start_lr < end_lr"),
    ({"start_lr": 0.0}, "learning rate"), ({"start_lr": -1e-3}, "learning rate"),
    ({"num_steps": 4}, "num_steps"), ({"diverge_factor": 1.0}, "diverge_factor"),
])
def test_lr_find_errors(kw, match):
    model, opt = warmed_up()
    with pytest.raises(ValueError, match=match) as err:
        lr_find.lr_find(model, opt, nn.functional.cross_entropy, toy_batches(2), **kw)
    one_line(str(err.value))


def test_lr_find_restores_a_scheduler_that_the_step_advances_and_uses_the_given_save_and_restore():
    model, opt = warmed_up(name="adamw")
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    sched.step()
    before, before_sched = snapshot(model, opt), copy.deepcopy(sched.state_dict())
    calls = []

    def save(m, o, s):
        calls.append("save")
        return lr_find.save_training_state(m, o, s)

    def restore(m, o, s, saved):
        calls.append("restore")
        lr_find.restore_training_state(m, o, s, saved)

    def step(x, y):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        sched.step()
        return loss.detach()

    lr_find.lr_find(model, opt, None, toy_batches(3), num_steps=8, step_fn=step, scheduler=sched, save=save,
                    restore=restore)
    assert calls == ["save", "restore"]
    assert sched.state_dict() == before_sched and sched.last_epoch == 1
    assert_restored(before, model, opt)
