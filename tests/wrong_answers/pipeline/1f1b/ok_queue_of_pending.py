"""Correct, written another way: a queue of the micro-batches whose forward ran and whose backward has not. A
forward runs while the stage holds fewer than it may (world_size - rank), otherwise the oldest pending backward."""
from collections import deque


def one_f_one_b_step(pipe):
    limit = pipe.world_size - pipe.rank
    pending, next_forward = deque(), 0
    while next_forward < pipe.micro_batches or pending:
        if next_forward < pipe.micro_batches and len(pending) < limit:
            x = pipe.recv_forward(next_forward)
            pipe.send_forward(next_forward, pipe.forward_compute(next_forward, x))
            pending.append(next_forward)
            next_forward += 1
        else:
            mb = pending.popleft()
            pipe.send_backward(mb, pipe.backward_compute(mb, pipe.recv_backward(mb)))
