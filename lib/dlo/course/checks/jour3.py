"""Checkers of Jour3/optimizers.ipynb (course ``optimizers``). The JIT notebook's are in :mod:`dlo.checks_jit`."""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from dlo.course.checks import optimizers_cases as oc
from dlo.course.checks.cases import compare, run_student
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

def _tensors_in(obj) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tensors_in(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in _tensors_in(v)]
    return []


_STATE_NAMES = {"momentum_buffer": "momentum buffers", "exp_avg": "Adam moments (exp_avg)",
                "exp_avg_sq": "Adam moments (exp_avg_sq)", "max_exp_avg_sq": "AMSGrad maxima (max_exp_avg_sq)",
                "step": "step counts"}


def _grad_difference(model, twin) -> str | None:
    for (k, p), q in zip(model.named_parameters(), twin.parameters()):
        if (p.grad is None) != (q.grad is None):
            return (f"the gradients (.grad) were not restored: {k}.grad is "
                    f"{'None' if p.grad is None else 'a tensor'}, expected {'None' if q.grad is None else 'a tensor'}")
        problem = None if q.grad is None else compare(p.grad, q.grad, f"{k}.grad", dtype=torch.float64)
        if problem:
            return f"the gradients (.grad) were not restored: {problem}"
    return None


def _optimizer_difference(model, opt, twin, twin_opt, last_lrs: list) -> str | None:
    held = [p for g in opt.param_groups for p in g["params"]]
    if {id(p) for p in held} != {id(p) for p in model.parameters()} or len(held) != len(list(model.parameters())):
        return "the optimizer no longer holds the model's parameters: copy values back into the same tensors"
    for (k, p), q in zip(model.named_parameters(), twin.parameters()):
        mine, ref = opt.state.get(p, {}), twin_opt.state.get(q, {})
        for key in sorted(set(ref) | set(mine)):
            a, b = mine.get(key), ref.get(key)
            name = _STATE_NAMES.get(key, key)
            if a is None or b is None:
                return (f"the optimizer's {name} were not restored: {k} has {'none' if a is None else 'one'} after the "
                        f"finder, expected {'none' if b is None else 'one'}")
            problem = compare(a, b, f"{k}'s {key}", dtype=torch.float64)
            if problem or type(a) is not type(b):
                return f"the optimizer's {name} were not restored: {problem or f'{k} has a {type(a).__name__}'}"
    for i, (group, ref) in enumerate(zip(opt.param_groups, twin_opt.param_groups)):
        for key in ref:
            if key != "params" and group.get(key) != ref[key]:
                last = i < len(last_lrs) and key == "lr" and group.get(key) == last_lrs[i]
                return (f"the optimizer's param groups were not restored: in group {i}, {key!r} is {group.get(key)!r} "
                        f"instead of {ref[key]!r}" + (" (the finder's last learning rate)" if last else ""))
    return None


def _first_difference(model, opt, sched, twin, twin_opt, twin_sched, last_lrs: list = ()) -> str | None:
    """What the finder left changed (compared with a twin that never ran it), in one sentence, or None."""
    for (k, p), q in zip(model.named_parameters(), twin.parameters()):
        problem = compare(p.detach(), q.detach(), k, dtype=torch.float64)
        if problem:
            return f"the model's parameters were not restored: {problem}"
    for (k, b), c in zip(model.named_buffers(), twin.buffers()):
        if not torch.equal(b, c):
            return ("the model's buffers (BatchNorm running statistics) were not restored: they are in named_buffers(), "
                    f"not in named_parameters() ({k} differs)")
    what = _grad_difference(model, twin) or _optimizer_difference(model, opt, twin, twin_opt, list(last_lrs))
    if what:
        return what
    if sched is not None:
        mine, ref = sched.state_dict(), twin_sched.state_dict()
        key = next((k for k in ref if mine.get(k) != ref[k]), None)
        if key:
            return f"the scheduler was not restored: {key} is {mine.get(key)!r} instead of {ref[key]!r}"
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
        cases = oc.finder_cases()
        for case in cases:
            _finder_case(save_training_state, restore_training_state, case)
    finally:
        set_rng_state(outer)
    return (f"parameters, buffers, gradients (None where there is none), optimizer state (SGD momentum, Adam and "
            f"AdamW moments, AMSGrad maxima, steps), both param groups, scheduler, modes and RNGs are restored bit "
            f"for bit on {len(cases)} cases (float32 and float64, no scheduler, StepLR, LambdaLR); training afterwards "
            "is as if the finder never ran, and a saved state can be restored twice")


def _live_tensors(model, opt) -> list[torch.Tensor]:
    return ([t for t in model.state_dict().values()] + [p.grad for p in model.parameters() if p.grad is not None]
            + _tensors_in(opt.state_dict()["state"]))


def _shared(saved, live: list[torch.Tensor]) -> bool:
    ptrs = {t.untyped_storage().data_ptr() for t in _tensors_in(saved) if t.numel()}
    return any(t.untyped_storage().data_ptr() in ptrs for t in live if t.numel())


def _finder_case(save_training_state: Callable, restore_training_state: Callable, case) -> None:
    import random

    import numpy as np

    model, opt, sched, batches, step = oc.finder_setup(**case.kwargs)
    twin, twin_opt, twin_sched, _, twin_step = oc.finder_setup(**case.kwargs)
    rng = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    live, shared, last_lrs = _live_tensors(model, opt), [], []

    def save(m, o, s):
        saved = save_training_state(m, o, s)
        shared.extend(["yes"] if _shared(saved, live) else [])
        return saved

    def restore(m, o, s, saved):
        last_lrs[:] = [g["lr"] for g in o.param_groups]
        restore_training_state(m, o, s, saved)

    run_student(lambda **_: lr_find(model, opt, None, batches, start_lr=1e-3, end_lr=1.0, num_steps=6, step_fn=step,
                                    scheduler=sched, save=save, restore=restore), case)
    what = _first_difference(model, opt, sched, twin, twin_opt, twin_sched, last_lrs) or _rng_difference(rng)
    if what:
        if shared:
            what += (" -- the saved state shares memory with the live tensors (state_dict() returns references "
                     "that the next steps overwrite): save copies (.clone(), copy.deepcopy)")
        raise CheckFailed(f"with {case.label}: {what}")
    for s in (step, twin_step):
        torch.manual_seed(7)
        for x, y in batches:
            s(x, y)
    expect(all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), twin.state_dict().values())),
           f"with {case.label}: training after the finder differs from training without it")
    _restore_twice(save_training_state, restore_training_state, case, (model, opt, sched, step),
                   (twin, twin_opt, twin_sched))


def _restore_twice(save_training_state, restore_training_state, case, run, twins) -> None:
    """The same saved state restored twice (two sweeps, or a sweep that is retried) must give it back twice."""
    model, opt, sched, step = run
    saved = run_student(lambda **_: save_training_state(model, opt, sched), case)
    kept = []
    for _ in range(2):
        for x, y in oc.finder_setup(**case.kwargs)[3][:2]:
            step(x, y)
        restore_training_state(model, opt, sched, saved)
        kept.append([name for name, tensors in (
            ("the parameters", list(model.state_dict().values())),
            ("the gradients (.grad)", [p.grad for p in model.parameters() if p.grad is not None]),
            ("the optimizer's state tensors", _tensors_in(opt.state_dict()["state"]))) if _shared(saved, tensors)])
    again = _first_difference(model, opt, sched, *twins)
    if again:
        held = kept[0]
        raise CheckFailed(f"with {case.label}: the same saved state restored a second time is not the state saved "
                          f"({again})" + (f": after the first restore, {' and '.join(held)} share memory with the saved state, "
                                          "so the next steps overwrite it in place: restore copies (.clone(), "
                                          "copy.deepcopy)" if held else ""))
