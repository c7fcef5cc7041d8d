"""Correct, written another way: the warm-up capped at m - 1 instead of m. With fewer micro-batches than the stages
after this one, m - 1 warm-up forwards then one forward/backward pair give the same order as m forwards first."""


def one_f_one_b_step(pipe):
    m = pipe.micro_batches
    warmup = min(pipe.world_size - pipe.rank - 1, m - 1)
    pending = []
    for mb in range(m):
        pipe.send_forward(mb, pipe.forward_compute(mb, pipe.recv_forward(mb)))
        pending.append(mb)
        if mb >= warmup:
            oldest = pending.pop(0)
            pipe.send_backward(oldest, pipe.backward_compute(oldest, pipe.recv_backward(oldest)))
    while pending:
        oldest = pending.pop(0)
        pipe.send_backward(oldest, pipe.backward_compute(oldest, pipe.recv_backward(oldest)))
