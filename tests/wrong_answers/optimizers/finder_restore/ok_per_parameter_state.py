"""Correct: the optimizer's per-parameter state deep-copied whole (every key, whatever the optimizer) and the
learning rate of each group, instead of optimizer.state_dict(); weights copied back in place."""
import torch
import copy

from dlo.training.checkpoint import rng_state, set_rng_state



def save_training_state(model, optimizer, scheduler):
    return {"tensors": [t.detach().clone() for t in [*model.parameters(), *model.buffers()]],
            "grads": [None if p.grad is None else p.grad.clone() for p in model.parameters()],
            "opt_state": [copy.deepcopy(dict(optimizer.state[p])) if p in optimizer.state else None
                          for p in model.parameters()],
            "groups": [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups],
            "scheduler": None if scheduler is None else copy.deepcopy(scheduler.state_dict()),
            "modes": [m.training for m in model.modules()],
            "rng": rng_state()}


def restore_training_state(model, optimizer, scheduler, saved):
    with torch.no_grad():
        for t, v in zip([*model.parameters(), *model.buffers()], saved["tensors"]):
            t.copy_(v)
    for p, g, st in zip(model.parameters(), saved["grads"], saved["opt_state"]):
        p.grad = None if g is None else g.clone()
        optimizer.state.pop(p, None)
        if st is not None:
            optimizer.state[p] = copy.deepcopy(st)
    for group, kept in zip(optimizer.param_groups, saved["groups"]):
        group.update(copy.deepcopy(kept))
    if scheduler is not None:
        scheduler.load_state_dict(copy.deepcopy(saved["scheduler"]))
    for m, mode in zip(model.modules(), saved["modes"]):
        m.training = mode
    set_rng_state(saved["rng"])
