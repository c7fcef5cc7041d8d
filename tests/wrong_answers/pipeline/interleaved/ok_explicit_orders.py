"""Correct, written another way: the orders of the forwards and of the backwards listed first with nested loops
(groups of p micro-batches, chunk by chunk), then run step by step with explicit branches."""


def interleaved_step(pipe):
    p, m, v = pipe.world_size, pipe.micro_batches, len(pipe.chunks)
    if m % p:
        raise ValueError(f"use a multiple of {p} micro-batches")
    forwards, backwards = [], []
    for start in range(0, m, p):
        for c in range(v):
            forwards += [(start + j, c) for j in range(p)]
            backwards += [(start + j, v - 1 - c) for j in range(p)]
    total = m * v
    warmup = total if m == p else min(total, 2 * (p - pipe.rank - 1) + (v - 1) * p)
    steps = [[("F", forwards[k])] for k in range(warmup)]
    steps += [[("F", forwards[warmup + i]), ("B", backwards[i])] for i in range(total - warmup)]
    steps += [[("B", backwards[k])] for k in range(total - warmup, total)]
    for actions in steps:
        received = []
        for kind, (mb, c) in actions:
            if kind == "F":
                received.append(pipe.recv_forward(mb, chunk=c))
            else:
                received.append(pipe.recv_backward(mb, chunk=c))
        produced = []
        for (kind, (mb, c)), data in zip(actions, received):
            if kind == "F":
                produced.append(pipe.forward_compute(mb, data, chunk=c))
            else:
                produced.append(pipe.backward_compute(mb, data, chunk=c))
        for (kind, (mb, c)), data in zip(actions, produced):
            if kind == "F":
                pipe.send_forward(mb, data, chunk=c)
            else:
                pipe.send_backward(mb, data, chunk=c)
