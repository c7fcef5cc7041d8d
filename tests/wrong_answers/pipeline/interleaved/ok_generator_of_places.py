"""Correct, written another way: the (micro-batch, chunk) of the k-th forward and backward from two small functions,
each step given as lists of forwards and backwards: every receive first, then the computes, then the sends."""


def interleaved_step(pipe):
    p, m, v = pipe.world_size, pipe.micro_batches, len(pipe.chunks)
    if m % p != 0:
        raise ValueError(f"the micro-batches enter in groups of {p} (world size): {m} is not a multiple of {p}")

    def forward_place(k):
        group, rest = divmod(k, p * v)
        return group * p + rest % p, rest // p

    def backward_place(k):
        mb, c = forward_place(k)
        return mb, v - 1 - c

    def run(fwd, bwd):
        got_f = [(mb, c, pipe.recv_forward(mb, chunk=c)) for mb, c in map(forward_place, fwd)]
        got_b = [(mb, c, pipe.recv_backward(mb, chunk=c)) for mb, c in map(backward_place, bwd)]
        out_f = [(mb, c, pipe.forward_compute(mb, x, chunk=c)) for mb, c, x in got_f]
        out_b = [(mb, c, pipe.backward_compute(mb, g, chunk=c)) for mb, c, g in got_b]
        for mb, c, y in out_f:
            pipe.send_forward(mb, y, chunk=c)
        for mb, c, dx in out_b:
            pipe.send_backward(mb, dx, chunk=c)

    total = m * v
    warmup = total if m == p else min(total, 2 * (p - pipe.rank - 1) + (v - 1) * p)
    for k in range(warmup):
        run([k], [])
    for i in range(total - warmup):
        run([warmup + i], [i])
    for k in range(total - warmup, total):
        run([], [k])
