"""Right values, but computed from the parameters themselves, not their values: the average is part of autograd's
graph, and each update keeps every previous update's graph alive (memory grows with the steps)."""

EXPECT = ["requires grad", "graph"]


def ema_update(ema_params, params, decay):
    return [decay * e + (1 - decay) * p.to(e.dtype) for e, p in zip(ema_params, params)]
