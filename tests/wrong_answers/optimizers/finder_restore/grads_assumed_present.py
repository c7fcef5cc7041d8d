"""Clones every parameter's .grad: a frozen parameter (or a model whose gradients were cleared to None) has none."""
import copy

from dlo.training.checkpoint import rng_state, set_rng_state


EXPECT = "AttributeError"


def save_training_state(model, optimizer, scheduler):
    return {"model": {k: v.detach().clone() for k, v in model.state_dict().items()},
            "grads": [p.grad.detach().clone() for p in model.parameters()],
            "optimizer": copy.deepcopy(optimizer.state_dict()),
            "scheduler": None if scheduler is None else copy.deepcopy(scheduler.state_dict()),
            "modes": [m.training for m in model.modules()],
            "rng": rng_state()}


def restore_training_state(model, optimizer, scheduler, saved):
    model.load_state_dict(saved["model"])
    for p, g in zip(model.parameters(), saved["grads"]):
        p.grad = g.clone()
    optimizer.load_state_dict(copy.deepcopy(saved["optimizer"]))
    if scheduler is not None:
        scheduler.load_state_dict(copy.deepcopy(saved["scheduler"]))
    for m, mode in zip(model.modules(), saved["modes"]):
        m.training = mode
    set_rng_state(saved["rng"])
