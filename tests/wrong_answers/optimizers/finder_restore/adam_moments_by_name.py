"""Restores the optimizer's state key by key (momentum, Adam's two moments, the step): AMSGrad's running maximum
(max_exp_avg_sq) keeps the sweep's values."""
import copy

from dlo.training.checkpoint import rng_state, set_rng_state


EXPECT = "max_exp_avg_sq"
KEYS = ("momentum_buffer", "exp_avg", "exp_avg_sq", "step")


def save_training_state(model, optimizer, scheduler):
    return {"model": {k: v.detach().clone() for k, v in model.state_dict().items()},
            "grads": [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()],
            "opt_state": [{k: copy.deepcopy(v) for k, v in optimizer.state.get(p, {}).items() if k in KEYS}
                          for p in model.parameters()],
            "lrs": [g["lr"] for g in optimizer.param_groups],
            "scheduler": None if scheduler is None else copy.deepcopy(scheduler.state_dict()),
            "modes": [m.training for m in model.modules()],
            "rng": rng_state()}


def restore_training_state(model, optimizer, scheduler, saved):
    model.load_state_dict(saved["model"])
    for p, g, st in zip(model.parameters(), saved["grads"], saved["opt_state"]):
        p.grad = None if g is None else g.clone()
        for k, v in st.items():
            optimizer.state[p][k] = copy.deepcopy(v)
    for group, lr in zip(optimizer.param_groups, saved["lrs"]):
        group["lr"] = lr
    if scheduler is not None:
        scheduler.load_state_dict(copy.deepcopy(saved["scheduler"]))
    for m, mode in zip(model.modules(), saved["modes"]):
        m.training = mode
    set_rng_state(saved["rng"])
