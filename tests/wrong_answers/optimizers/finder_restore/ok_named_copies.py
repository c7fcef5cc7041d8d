"""Correct: copies kept by parameter name (weights and buffers from state_dict, gradients by name), the optimizer's
and scheduler's states deep-copied on save and on restore, the modes by module name."""
import copy

from dlo.training.checkpoint import rng_state, set_rng_state


def save_training_state(model, optimizer, scheduler):
    return {"weights": {k: v.detach().clone() for k, v in model.state_dict().items()},
            "grads": {k: (None if p.grad is None else p.grad.detach().clone()) for k, p in model.named_parameters()},
            "opt": copy.deepcopy(optimizer.state_dict()),
            "sched": copy.deepcopy(scheduler.state_dict()) if scheduler is not None else None,
            "modes": {k: m.training for k, m in model.named_modules()},
            "rng": rng_state()}


def restore_training_state(model, optimizer, scheduler, saved):
    model.load_state_dict(saved["weights"])
    for k, p in model.named_parameters():
        g = saved["grads"][k]
        p.grad = None if g is None else g.clone()
    optimizer.load_state_dict(copy.deepcopy(saved["opt"]))
    if scheduler is not None:
        scheduler.load_state_dict(copy.deepcopy(saved["sched"]))
    for k, m in model.named_modules():
        m.training = saved["modes"][k]
    set_rng_state(saved["rng"])
