"""Family: unknown inputs silently mapped. Never refuses a micro-batch count that is not a multiple of p: with
p=2 and m=3 the groups of p run past the last micro-batch, or leave some out, instead of a clear ValueError."""

EXPECT = ["m not a multiple of p", "ValueError"]


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

    warmup = total if m == p else min(total, 2 * (p - pipe.rank - 1) + (v - 1) * p)
    for k in range(warmup):
        step([("F", k)])
    for i in range(total - warmup):
        step([("F", warmup + i), ("B", i)])
    for k in range(total - warmup, total):
        step([("B", k)])
