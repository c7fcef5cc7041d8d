"""Correct: one deep copy of everything (gradients through a list of clones), restored through the same copies."""
import copy

from dlo.training.checkpoint import rng_state, set_rng_state


def save_training_state(model, optimizer, scheduler):
    state = {
        "weights": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "grads": [p.grad for p in model.parameters()],
        "training": {name: m.training for name, m in model.named_modules()},
    }
    state = copy.deepcopy(state)
    state["rng"] = rng_state()
    return state


def restore_training_state(model, optimizer, scheduler, saved):
    saved = copy.deepcopy(saved)
    model.load_state_dict(saved["weights"])
    optimizer.load_state_dict(saved["optimizer"])
    if scheduler is not None:
        scheduler.load_state_dict(saved["scheduler"])
    for p, grad in zip(model.parameters(), saved["grads"]):
        p.grad = grad
    for name, m in model.named_modules():
        m.training = saved["training"][name]
    set_rng_state(saved["rng"])
