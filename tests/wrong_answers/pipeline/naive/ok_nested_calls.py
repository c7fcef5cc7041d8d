"""Correct, written another way: each direction written as one nested expression."""


def naive_step(pipe):
    pipe.send_forward(0, pipe.forward_compute(0, pipe.recv_forward(0)))
    pipe.send_backward(0, pipe.backward_compute(0, pipe.recv_backward(0)))
