"""Checkers of Jour3/optimizers.ipynb (course ``optimizers``). The JIT notebook's are in :mod:`dlo.checks_jit`."""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from dlo.course.checks import optimizers_cases as oc
from dlo.course.checks.cases import compare
from dlo.course.checks.framework import CheckFailed, expect, register
from dlo.lessons.lr_find import lr_find
from dlo.training.checkpoint import rng_state, set_rng_state

OPTIM_NB = "Jour3/optimizers.ipynb"


@register("optimizers", "warmup", ("warmup_cosine_lr",), OPTIM_NB)
def _check_warmup(warmup_cosine_lr: Callable) -> str:
    n = oc.check_warmup(warmup_cosine_lr)
    return (f"linear warm-up to the base rate, then a cosine down to 0 ({n} steps of 12 schedules, warm-ups of 1 to "
            "100 steps, both sides of the warm-up's end)")


@register("optimizers", "lion", ("lion_update",), OPTIM_NB)
def _check_lion(lion_update: Callable) -> str:
    n = oc.check_lion(lion_update)
    return (f"same weights and momentum as dlo.training.optim.Lion on {n} cases (float32 and float64, 1 to 3 steps, "
            "with and without weight decay, sign(0) = 0)")


_LOSS_MISTAKES = (("the sum of the micro-batches' mean losses", lambda means, sizes, n: sum(means)),
                  ("the plain mean of the micro-batches' mean losses (they differ in size: weight each by its share "
                   "of the batch)", lambda means, sizes, n: sum(means) / len(means)),
                  ("the last micro-batch's loss only", lambda means, sizes, n: means[-1]),
                  ("the last micro-batch's weighted loss only", lambda means, sizes, n: means[-1] * sizes[-1] / n))


def _micro(case) -> tuple[list[list], list[float], list[int]]:
    """Per micro-batch of images.chunk(k): the gradients of its mean loss, the mean loss and the size."""
    model, criterion, x, y = oc.accumulate_setup(**case.kwargs)
    grads, means = [], []
    for a, b in zip(x.chunk(case.kwargs["k"]), y.chunk(case.kwargs["k"])):
        model.zero_grad(set_to_none=True)
        loss = criterion(model(a), b)
        loss.backward()
        grads.append([None if p.grad is None else p.grad.clone() for p in model.parameters()])
        means.append(loss.item())
    return grads, means, [len(a) for a in x.chunk(case.kwargs["k"])]


def _grad_mistake(runs, cases) -> str:
    """The known wrong weighting that the answer's gradients follow on every case, if any."""
    def weighted(case, weight):
        grads, _, sizes = _micro(case)
        return [None if gs[0] is None else sum(weight(j, sizes) * g[i] for j, g in enumerate(grads))
                for i, gs in enumerate(zip(*grads))]

    k = lambda case: case.kwargs["k"]  # noqa: E731
    for why, weight in (
            ("each micro-batch's loss is not weighted: weight it by len(micro_batch) / len(images)",
             lambda case: (lambda j, sizes: 1.0)),
            ("each micro-batch's loss is divided by k: right only when all micro-batches have the same size; weight "
             "it by len(micro_batch) / len(images)", lambda case: (lambda j, sizes: 1.0 / k(case))),
            ("the gradients are the last micro-batch's only: the earlier ones were cleared; "
             "accumulate them, each loss weighted by len(micro_batch) / len(images)",
             lambda case: (lambda j, sizes: sizes[j] / sum(sizes) if j == len(sizes) - 1 else 0.0))):
        if all(compare(run[0], weighted(case, weight(case)), "") is None for run, case in zip(runs, cases)):
            return why
    return ""


@register("optimizers", "accumulate", ("accumulated_backward",), OPTIM_NB)
def _check_accumulate(accumulated_backward: Callable) -> str:
    cases = oc.accumulate_cases()
    runs = [oc.accumulate_run(accumulated_backward, case) for case in cases]
    for case, (grads, total, sizes) in zip(cases, runs):
        n, k = case.kwargs["n"], case.kwargs["k"]
        pieces = [len(c) for c in torch.arange(n).chunk(k)]
        expect(len(sizes) in (k, len(pieces)) and sum(sizes) == n and min(sizes, default=0) > 0,
               f"with {case.label}: the model ran on batches of {sizes} samples, expected k={k} micro-batches "
               f"covering the {n} samples once (images.chunk(k) gives {pieces}): only one micro-batch's activations "
               "may be alive at a time")
        want, want_loss = oc.accumulate_reference(case)
        for i, (g, w) in enumerate(zip(grads, want)):
            expect(w is None or g is not None, f"with {case.label}: parameter {i} got no gradient: call backward() on "
                                               "every micro-batch's loss")
            expect(w is not None or g is None, f"with {case.label}: parameter {i} (frozen, or unused by the forward) "
                                               "got a gradient: leave .grad to backward()")
        problem = compare(grads, want, "the gradients", scale=10)
        if problem:
            why = _grad_mistake(runs, cases)
            raise CheckFailed(f"with {case.label}: {problem}: the accumulated gradients differ from the big batch's"
                              + (f" -- {why}" if why else ""))
        expect(isinstance(total, float),
               f"with {case.label}: return the whole batch's mean loss as a Python float, got {type(total).__name__}"
               + (" (a tensor keeps the graph alive: .item())" if isinstance(total, torch.Tensor) else ""))
        problem = compare(total, want_loss, "the returned loss", scale=10)
        if problem:
            why = next((w for w, f in _LOSS_MISTAKES if all(
                compare(r[1], f(*_micro(c)[1:], c.kwargs["n"]), "", scale=10) is None for r, c in zip(runs, cases))), "")
            raise CheckFailed(f"with {case.label}: {problem}, the whole batch's mean loss"
                              + (f" -- that is {why}" if why else ""))
    return (f"k micro-batches give the big batch's gradient and mean loss on {len(cases)} cases (1 to 30 samples, k "
            "from 1 to the batch size, float32 and float64, frozen and unused parameters), no optimizer step")


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
