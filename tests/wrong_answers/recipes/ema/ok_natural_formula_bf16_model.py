"""Correct: the formula as written in the lesson, decay * ema + (1 - decay) * weights, with no cast: for a bfloat16
model the product (1 - decay) * weights is rounded to bfloat16 before it is added to the float32 average, an error
of about 1e-5 per step that leaves the average moving."""


def ema_update(ema_params, params, decay):
    return [decay * e + (1 - decay) * p.detach() for e, p in zip(ema_params, params)]
