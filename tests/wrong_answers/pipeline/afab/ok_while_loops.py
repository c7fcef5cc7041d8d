"""Correct, written another way: two while loops and helpers for one forward and one backward."""


def afab_step(pipe):
    def forward(mb):
        y = pipe.forward_compute(mb, pipe.recv_forward(mb))
        pipe.send_forward(mb, y)

    def backward(mb):
        dx = pipe.backward_compute(mb, pipe.recv_backward(mb))
        pipe.send_backward(mb, dx)

    mb = 0
    while mb < pipe.micro_batches:
        forward(mb)
        mb += 1
    mb = 0
    while mb < pipe.micro_batches:
        backward(mb)
        mb += 1
