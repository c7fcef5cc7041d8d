"""Saves clones of the gradients but hands the saved tensors themselves back to .grad: a step that clears the
gradients in place (zero_grad(set_to_none=False)) then backward() overwrite the saved copy."""
import copy

from dlo.training.checkpoint import rng_state, set_rng_state


EXPECT = ["second time", "gradients (.grad) share memory"]


def save_training_state(model, optimizer, scheduler):
    return {"model": {k: v.detach().clone() for k, v in model.state_dict().items()},
            "grads": [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()],
            "optimizer": copy.deepcopy(optimizer.state_dict()),
            "scheduler": None if scheduler is None else copy.deepcopy(scheduler.state_dict()),
            "modes": [m.training for m in model.modules()],
            "rng": rng_state()}


def restore_training_state(model, optimizer, scheduler, saved):
    model.load_state_dict(saved["model"])
    for p, g in zip(model.parameters(), saved["grads"]):
        p.grad = g
    optimizer.load_state_dict(copy.deepcopy(saved["optimizer"]))
    if scheduler is not None:
        scheduler.load_state_dict(copy.deepcopy(saved["scheduler"]))
    for m, mode in zip(model.modules(), saved["modes"]):
        m.training = mode
    set_rng_state(saved["rng"])
