"""Family: a flag instead of the behaviour. Runs each action of a steady step as receive-compute-send in turn: right
computes, but on NCCL the transfers deadlock."""
import torch

EXPECT = 'wait for each other forever'


def interleaved_step(pipe):
    p, m, v = pipe.world_size, pipe.micro_batches, len(pipe.chunks)
    total = m * v

    def where(kind, k):
        group, w = divmod(k, p * v)
        mb, c = group * p + w % p, w // p
        return (mb, c) if kind == "F" else (mb, v - 1 - c)

    def step(actions):
        places = [(kind, *where(kind, k)) for kind, k in actions]
        for kind, mb, c in places:
            if kind == "F":
                pipe.send_forward(mb, pipe.forward_compute(mb, pipe.recv_forward(mb, chunk=c), chunk=c), chunk=c)
            else:
                pipe.send_backward(mb, pipe.backward_compute(mb, pipe.recv_backward(mb, chunk=c), chunk=c), chunk=c)

    warmup = total if m == p else min(total, 2 * (p - pipe.rank - 1) + (v - 1) * p)
    for k in range(warmup):
        step([("F", k)])
    for i in range(total - warmup):
        step([("F", warmup + i), ("B", i)])
    for k in range(total - warmup, total):
        step([("B", k)])
