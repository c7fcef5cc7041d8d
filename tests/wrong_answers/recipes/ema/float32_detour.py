"""Converts the weights to float32 before averaging ("an average in float32"): with a float64 model and a float64
average, the weights lose their low bits on the way."""

EXPECT = ["float64 model", "more than the rounding"]


def ema_update(ema_params, params, decay):
    return [decay * e + (1 - decay) * p.detach().float() for e, p in zip(ema_params, params)]
