"""The optimizer's per-parameter state restored by hand, and "the" learning rate saved as group 0's and put back on
every group: a second param group with its own lr gets group 0's."""
import copy

from dlo.training.checkpoint import rng_state, set_rng_state


EXPECT = ["param groups were not restored", "group 1"]


def save_training_state(model, optimizer, scheduler):
    return {"model": {k: v.detach().clone() for k, v in model.state_dict().items()},
            "grads": [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()],
            "opt_state": [copy.deepcopy(optimizer.state.get(p, {})) for p in model.parameters()],
            "lr": optimizer.param_groups[0]["lr"],
            "scheduler": None if scheduler is None else copy.deepcopy(scheduler.state_dict()),
            "modes": [m.training for m in model.modules()],
            "rng": rng_state()}


def restore_training_state(model, optimizer, scheduler, saved):
    model.load_state_dict(saved["model"])
    for p, g, st in zip(model.parameters(), saved["grads"], saved["opt_state"]):
        p.grad = None if g is None else g.clone()
        optimizer.state.pop(p, None)
        if st:
            optimizer.state[p] = copy.deepcopy(st)
    for group in optimizer.param_groups:
        group["lr"] = saved["lr"]
    if scheduler is not None:
        scheduler.load_state_dict(copy.deepcopy(saved["scheduler"]))
    for m, mode in zip(model.modules(), saved["modes"]):
        m.training = mode
    set_rng_state(saved["rng"])
