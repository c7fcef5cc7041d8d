"""Family: inputs that never reach the mistake (a float32 model hides it). Casts the average to the model's dtype:
with a bfloat16 model and a decay close to 1 the updates fall below bf16's resolution and the average stops."""
EXPECT = "bfloat16"


def ema_update(ema_params, params, decay):
    return [(decay * e + (1 - decay) * p.detach()).to(p.dtype) for e, p in zip(ema_params, params)]
