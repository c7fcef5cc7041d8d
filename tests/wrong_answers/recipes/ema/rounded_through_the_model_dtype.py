"""Family: a flag right (the dtype returned is float32), the behaviour wrong. The new average is rounded to the
model's dtype and converted back: with a bfloat16 model it comes back as float32 but never moves."""
EXPECT = ["bfloat16", "more than the rounding"]


def ema_update(ema_params, params, decay):
    return [(decay * e + (1 - decay) * p.detach()).to(p.dtype).to(e.dtype) for e, p in zip(ema_params, params)]
