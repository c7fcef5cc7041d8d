"""Family: part of the result. In the steady state runs the backward before the forward: the last stage asks for a
gradient it has not produced."""
import torch

EXPECT = "came before its forward"


def one_f_one_b_step(pipe):
    m = pipe.micro_batches
    warmup = min(pipe.world_size - pipe.rank - 1, m)

    def forward(mb):
        pipe.send_forward(mb, pipe.forward_compute(mb, pipe.recv_forward(mb)))

    def backward(mb):
        pipe.send_backward(mb, pipe.backward_compute(mb, pipe.recv_backward(mb)))

    for mb in range(warmup):
        forward(mb)
    for i in range(m - warmup):
        backward(i)
        forward(warmup + i)
    for mb in range(m - warmup, m):
        backward(mb)
