"""Saves and restores the model only: the sweep's steps stay in the optimizer's momentum buffers."""
import copy

from dlo.training.checkpoint import rng_state, set_rng_state


EXPECT = "momentum buffers were not restored"


def save_training_state(model, optimizer, scheduler):
    return {"model": {k: v.detach().clone() for k, v in model.state_dict().items()},
            "grads": [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()],
            "optimizer": None,
            "scheduler": None if scheduler is None else copy.deepcopy(scheduler.state_dict()),
            "modes": [m.training for m in model.modules()],
            "rng": rng_state()}


def restore_training_state(model, optimizer, scheduler, saved):
    model.load_state_dict(saved["model"])
    for p, g in zip(model.parameters(), saved["grads"]):
        p.grad = None if g is None else g.clone()
    pass  # the optimizer keeps the same parameters: nothing to restore
    if scheduler is not None:
        scheduler.load_state_dict(copy.deepcopy(saved["scheduler"]))
    for m, mode in zip(model.modules(), saved["modes"]):
        m.training = mode
    set_rng_state(saved["rng"])
