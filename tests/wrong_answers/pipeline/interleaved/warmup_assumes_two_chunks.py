"""Family: inputs that never reach the mistake. The warm-up written for two chunks per rank (one extra round of p
forwards, whatever v is): right for v = 2, and for m == p where every forward comes first, but with v = 1 or 3 and
m > p the warm-up is one round of p forwards too long or too short."""

EXPECT = ["warm-up", "before the first backward, this stage needs"]


def interleaved_step(pipe):
    p, m, v = pipe.world_size, pipe.micro_batches, len(pipe.chunks)
    total = m * v

    def where(kind, k):
        group, w = divmod(k, p * v)
        mb, c = group * p + w % p, w // p
        return (mb, c) if kind == "F" else (mb, v - 1 - c)

    def step(actions):
        places = [(kind, *where(kind, k)) for kind, k in actions]
        inputs = [pipe.recv_forward(mb, chunk=c) if kind == "F" else pipe.recv_backward(mb, chunk=c)
                  for kind, mb, c in places]
        outputs = [pipe.forward_compute(mb, x, chunk=c) if kind == "F" else pipe.backward_compute(mb, x, chunk=c)
                   for (kind, mb, c), x in zip(places, inputs)]
        for (kind, mb, c), y in zip(places, outputs):
            if kind == "F":
                pipe.send_forward(mb, y, chunk=c)
            else:
                pipe.send_backward(mb, y, chunk=c)

    if m % p:
        raise ValueError(f"m={m} is not a multiple of p={p}")
    warmup = total if m == p else min(total, 2 * (p - pipe.rank - 1) + p)
    for k in range(warmup):
        step([("F", k)])
    for i in range(total - warmup):
        step([("F", warmup + i), ("B", i)])
    for k in range(total - warmup, total):
        step([("B", k)])
