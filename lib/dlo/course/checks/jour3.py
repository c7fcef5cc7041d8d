"""Checkers of Jour3/optimizers.ipynb (course ``optimizers``). The JIT notebook's are in :mod:`dlo.checks_jit`."""
from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn

from dlo.course.checks.framework import CheckFailed, expect, register
from dlo.lessons.lr_find import lr_find
from dlo.training.checkpoint import rng_state, set_rng_state
from dlo.training.optim import Lion

OPTIM_NB = "Jour3/optimizers.ipynb"


@register("optimizers", "warmup", ("warmup_cosine_lr",), OPTIM_NB)
def _check_warmup(warmup_cosine_lr: Callable) -> str:
    def expected(step: int, total: int, warmup: int, base: float) -> float:
        if step < warmup:
            return base * (step + 1) / warmup
        return base * 0.5 * (1 + math.cos(math.pi * (step - warmup) / (total - warmup)))

    for total, warmup, base in ((100, 10, 0.1), (50, 1, 2.0), (1000, 100, 3e-4)):
        for step in sorted({0, 1, warmup - 1, warmup, warmup + 1, total // 2, total - 1}):
            got = warmup_cosine_lr(step, total, warmup, base)
            want = expected(step, total, warmup, base)
            ok = isinstance(got, (int, float)) and abs(got - want) <= 1e-9 * max(1.0, abs(want))
            why = ""
            if not ok and step >= warmup and isinstance(got, (int, float)):
                linear = base * (1 - (step - warmup) / (total - warmup))
                why = " -- that is a linear decay after the warm-up: the rate follows half a cosine" \
                    if abs(got - linear) <= 1e-9 * max(1.0, abs(linear)) else ""
            expect(ok, f"step {step} of {total} (warm-up {warmup}, base {base}): expected {want:.6g}, got {got!r}{why}")
    return "linear warm-up to the base rate, then a cosine down to 0"


def _lion_inputs(g: torch.Generator, shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """p, grad, m where sign(m), sign(g) and sign(beta1 * m + (1 - beta1) * g) disagree on many coordinates."""
    p0 = torch.randn(*shape, generator=g)
    m0 = torch.randn(*shape, generator=g)
    grad = -m0 * (1 + 200 * torch.rand(*shape, generator=g))  # opposite to m, 1 to 201 times larger
    flip = torch.rand(*shape, generator=g) < 0.3  # and on some coordinates the same sign as m
    grad = torch.where(flip, -grad, grad)
    return p0, grad, m0


@register("optimizers", "lion", ("lion_update",), OPTIM_NB)
def _check_lion(lion_update: Callable) -> str:
    g = torch.Generator().manual_seed(0)
    for wd, (lr, beta1, beta2), shape in ((0.0, (0.01, 0.9, 0.99), (5, 7)), (0.1, (0.003, 0.8, 0.95), (6, 4))):
        p0, grad, m0 = _lion_inputs(g, shape)
        inputs = [t.clone() for t in (p0, grad, m0)]
        new_p, new_m = lion_update(*inputs, lr, beta1, beta2, wd)
        expect(all(torch.equal(a, b) for a, b in zip(inputs, (p0, grad, m0))),
               "do not modify p, g or m in place: return new tensors")
        expect(isinstance(new_p, torch.Tensor) and new_p.shape == p0.shape, "return (new_p, new_m), two tensors shaped like p")
        ref = nn.Parameter(p0.clone())
        opt = Lion([ref], lr=lr, betas=(beta1, beta2), weight_decay=wd)
        opt.state[ref]["exp_avg"] = m0.clone()
        ref.grad = grad.clone()
        opt.step()
        if not torch.allclose(new_p, ref.detach(), atol=1e-7):
            decayed = p0 * (1 - lr * wd)
            step = (decayed - new_p) / lr  # what your update did, in units of lr
            why = ""
            if torch.allclose(step, torch.sign(m0), atol=1e-4):
                why = ": you took sign(m), the old momentum; Lion steps along sign(beta1 * m + (1 - beta1) * g)"
            elif torch.allclose(step, torch.sign(grad), atol=1e-4):
                why = ": you took sign(g); Lion steps along sign(beta1 * m + (1 - beta1) * g)"
            elif torch.allclose(step, torch.sign(beta2 * m0 + (1 - beta2) * grad), atol=1e-4):
                why = ": the direction mixes m and g with beta2; it uses beta1 (beta2 is for the momentum update)"
            elif torch.allclose(new_p, p0 - lr * torch.sign(beta1 * m0 + (1 - beta1) * grad), atol=1e-7):
                why = f": the weight decay is missing (weight_decay={wd}): multiply p by (1 - lr * weight_decay)"
            raise CheckFailed(f"weights differ from dlo.training.optim.Lion (lr={lr}, betas=({beta1}, {beta2}), "
                              f"weight_decay={wd}){why or ': p * (1 - lr * wd) - lr * sign(beta1 * m + (1 - beta1) * g)'}")
        if not torch.allclose(new_m, opt.state[ref]["exp_avg"], rtol=1e-5, atol=1e-6):  # lerp rounds otherwise
            why = (" (you used beta1: the momentum uses beta2)"
                   if torch.allclose(new_m, beta1 * m0 + (1 - beta1) * grad, atol=1e-7) else "")
            raise CheckFailed(f"momentum differs: beta2 * m + (1 - beta2) * g{why}")
    return "same weights and momentum as dlo.training.optim.Lion (two sets of hyper-parameters, with and without weight decay)"


def _returned_loss_mistake(total: float, micro: list[tuple[int, float]], n: int) -> str:
    """What a wrong returned loss is, from the micro-batches' (size, mean loss), in words."""
    means = [m for _, m in micro]
    for value, why in ((sum(means), "the sum of the micro-batches' mean losses"),
                       (sum(means) / len(means), "the plain mean of the micro-batches' mean losses (they differ in "
                                                 "size: weight each by its share of the batch)"),
                       (means[-1], "the last micro-batch's loss only"),
                       (means[-1] * micro[-1][0] / n, "the last micro-batch's weighted loss only")):
        if abs(total - value) < 1e-5:
            return f": that is {why}"
    return ""


def _micro_batch_sizes(model: nn.Module) -> tuple[list[int], Callable[[], None]]:
    sizes: list[int] = []
    handle = model.register_forward_pre_hook(lambda _m, args: sizes.append(len(args[0])))
    return sizes, handle.remove


@register("optimizers", "accumulate", ("accumulated_backward",), OPTIM_NB)
def _check_accumulate(accumulated_backward: Callable) -> str:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(30, 6, generator=g), torch.randint(0, 3, (30,), generator=g)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    criterion = nn.CrossEntropyLoss()
    criterion(model(x), y).backward()
    big = [p.grad.clone() for p in model.parameters()]
    for k in (3, 4):  # 4 does not divide 30: the micro-batches have different sizes
        want_sizes = [len(c) for c in x.chunk(k)]
        model.zero_grad(set_to_none=True)
        sizes, remove = _micro_batch_sizes(model)
        try:
            total = accumulated_backward(model, criterion, x, y, k)
        finally:
            remove()
        expect(all(p.grad is not None for p in model.parameters()), "call backward() on every micro-batch's loss")
        expect(sorted(sizes) == sorted(want_sizes),
               f"k={k}: the model ran on batches of {sizes} images, expected k={k} micro-batches of {want_sizes} "
               f"(the {len(x)} images in k pieces): only one micro-batch's activations may be alive at a time")
        for p, ref in zip(model.parameters(), big):
            if not torch.allclose(p.grad, ref, atol=1e-6):
                ratio = (p.grad.norm() / ref.norm()).item()
                raise CheckFailed(f"k={k}: the summed gradients are {ratio:.2f} x the big batch's: weight each "
                                  "micro-batch's loss by len(micro_batch) / len(images)")
        with torch.no_grad():
            full = criterion(model(x), y).item()
            micro = [(len(a), criterion(model(a), b).item()) for a, b in zip(x.chunk(k), y.chunk(k))]
        expect(isinstance(total, float),
               f"k={k}: return the whole batch's mean loss as a Python float, got {type(total).__name__}"
               + (" (a tensor keeps the graph alive: .item())" if isinstance(total, torch.Tensor) else ""))
        expect(abs(total - full) < 1e-5, f"k={k}: the returned loss is {total:.4f}, the whole batch's mean loss is "
                                         f"{full:.4f}{_returned_loss_mistake(total, micro, len(x))}")
    return "k micro-batches give the big batch's gradient and mean loss (weighted by their size), no optimizer step"


# --------------------------------------------------------------------------------------------------
# The LR finder's exact restore
# --------------------------------------------------------------------------------------------------

def _finder_setup(opt_name: str):
    """A model with BatchNorm (one frozen in eval mode) and dropout, an optimizer and a warm-up scheduler
    that have taken 3 steps (momentum buffers / Adam moments and step counts exist), and gradients left over."""
    import random

    import numpy as np

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(7, 13), nn.BatchNorm1d(13), nn.ReLU(), nn.Dropout(0.3), nn.Linear(13, 5),
                          nn.BatchNorm1d(5))
    if opt_name == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 10))
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(9, 7, generator=g), torch.randint(0, 5, (9,), generator=g)) for _ in range(4)]

    def step(x, y):
        opt.zero_grad()
        if random.random() < 2.0 and np.random.rand() < 2.0:  # an augmentation's draws: Python's and NumPy's RNGs
            x = x * 1.0
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        sched.step()
        return loss.detach()

    for x, y in batches[:3]:
        step(x, y)
    nn.functional.cross_entropy(model(batches[3][0]), batches[3][1]).backward()  # gradients left in .grad
    model[5].eval()  # a frozen BatchNorm inside a model in train mode
    torch.manual_seed(5)
    random.seed(5)
    np.random.seed(5)
    return model, opt, sched, batches, step


def _tensors_in(obj) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tensors_in(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in _tensors_in(v)]
    return []


def _first_difference(model, opt, sched, twin, twin_opt, twin_sched) -> str | None:
    """What the finder left changed (compared with a twin that never ran it), in one sentence, or None."""
    params, twin_params = dict(model.named_parameters()), dict(twin.named_parameters())
    if any(not torch.equal(p, twin_params[k]) for k, p in params.items()):
        return "the model's parameters were not restored"
    buffers, twin_buffers = dict(model.named_buffers()), dict(twin.named_buffers())
    if any(not torch.equal(b, twin_buffers[k]) for k, b in buffers.items()):
        return "the model's buffers (BatchNorm running statistics) were not restored: they are in named_buffers(), " \
               "not in named_parameters()"
    for k, p in params.items():
        q = twin_params[k].grad
        if (p.grad is None) != (q is None) or (q is not None and not torch.equal(p.grad, q)):
            return "the gradients (.grad) were not restored: the finder's last step left its own"
    if any(a is not b for a, b in zip(opt.param_groups[0]["params"], model.parameters())):
        return "the optimizer no longer holds the model's parameters: copy values back into the same tensors"
    names = {"momentum_buffer": "momentum buffers", "exp_avg": "Adam moments (exp_avg)",
             "exp_avg_sq": "Adam moments (exp_avg_sq)", "step": "step counts"}
    for p, q in zip(model.parameters(), twin.parameters()):
        mine, ref = opt.state.get(p, {}), twin_opt.state.get(q, {})
        for key in ref:
            a, b = mine.get(key), ref[key]
            same = a is not None and (torch.equal(torch.as_tensor(a), torch.as_tensor(b)) if isinstance(b, torch.Tensor)
                                      or isinstance(a, torch.Tensor) else a == b)
            if not same:
                return f"the optimizer's {names.get(key, key)} were not restored"
    for group, ref in zip(opt.param_groups, twin_opt.param_groups):
        for key in ref:
            if key != "params" and group.get(key) != ref[key]:
                return (f"the optimizer's param groups were not restored: {key!r} is {group.get(key)!r} instead of "
                        f"{ref[key]!r}" + (" (the finder's last learning rate)" if key == "lr" else ""))
    if sched.state_dict() != twin_sched.state_dict():
        return (f"the scheduler was not restored (last_epoch {sched.last_epoch} instead of {twin_sched.last_epoch}): "
                "the next lr it sets would be wrong")
    modes = [(n, m.training, t.training) for (n, m), t in zip(model.named_modules(), twin.modules())]
    if any(a != b for _, a, b in modes):
        return ("the train/eval mode of the submodules was not restored (" +
                ", ".join(f"{n or 'model'} {'train' if a else 'eval'}" for n, a, b in modes if a != b) + ")")
    return None


def _rng_difference(reference: dict) -> str | None:
    import random

    import numpy as np

    if not torch.equal(torch.get_rng_state(), reference["torch"]):
        return "torch's random number generator was not restored: dropout after the finder draws other masks"
    if random.getstate() != reference["python"]:
        return "Python's random number generator (random) was not restored: augmentations draw other numbers"
    a, b = np.random.get_state(), reference["numpy"]
    if not (a[0] == b[0] and (a[1] == b[1]).all() and a[2:] == b[2:]):
        return "NumPy's random number generator was not restored: augmentations draw other numbers"
    return None


@register("optimizers", "finder_restore", ("save_training_state", "restore_training_state"), OPTIM_NB)
def _check_finder_restore(save_training_state: Callable, restore_training_state: Callable) -> str:
    outer = rng_state()  # the notebook's own random state, put back after the check
    try:
        return _finder_restore(save_training_state, restore_training_state)
    finally:
        set_rng_state(outer)


def _finder_restore(save_training_state: Callable, restore_training_state: Callable) -> str:
    import random

    import numpy as np

    model, opt, _, batches, _ = _finder_setup("sgd")
    try:  # lr_find's default: no scheduler
        restore_training_state(model, opt, None, save_training_state(model, opt, None))
    except (AttributeError, TypeError) as exc:
        raise CheckFailed(f"with scheduler=None (lr_find's default) saving or restoring fails ({exc}): save and "
                          "restore the scheduler only when there is one") from None
    for opt_name in ("sgd", "adamw"):
        model, opt, sched, batches, step = _finder_setup(opt_name)
        twin, twin_opt, twin_sched, _, twin_step = _finder_setup(opt_name)
        rng = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
        live = _tensors_in(dict(model.state_dict())) + _tensors_in(opt.state_dict()["state"])
        shared: list[str] = []

        def save(m, o, s):
            saved = save_training_state(m, o, s)
            ptrs = {t.untyped_storage().data_ptr() for t in _tensors_in(saved) if t.numel()}
            if any(t.untyped_storage().data_ptr() in ptrs for t in live if t.numel()):
                shared.append("yes")
            return saved

        lr_find(model, opt, None, batches, start_lr=1e-3, end_lr=1.0, num_steps=6, step_fn=step, scheduler=sched,
                save=save, restore=restore_training_state)
        what = _first_difference(model, opt, sched, twin, twin_opt, twin_sched) or _rng_difference(rng)
        if what:
            if shared:
                what += (" -- the saved state shares memory with the live tensors (state_dict() returns references "
                         "that the next steps overwrite): save copies (.clone(), copy.deepcopy)")
            raise CheckFailed(f"{opt_name}: {what}")
        for m, s in ((model, step), (twin, twin_step)):
            torch.manual_seed(7)
            for x, y in batches:
                s(x, y)
        expect(all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), twin.state_dict().values())),
               f"{opt_name}: training after the finder differs from training without it")
        # the same saved state restored twice (two sweeps, or a sweep that is retried) must give it back twice
        saved = save_training_state(model, opt, sched)
        for _ in range(2):
            for x, y in batches[:2]:
                step(x, y)
            restore_training_state(model, opt, sched, saved)
        again = _first_difference(model, opt, sched, twin, twin_opt, twin_sched)
        expect(again is None, f"{opt_name}: the same saved state restored a second time is not the state saved "
                              f"({again}): the first restore handed the saved tensors themselves to the optimizer, "
                              "whose steps then overwrote them in place: restore copies of them (copy.deepcopy)")
    return ("parameters, buffers, gradients, optimizer state (SGD momentum, AdamW moments and steps), param groups, "
            "scheduler, modes and RNGs are restored bit for bit; training afterwards is as if the finder never ran")
