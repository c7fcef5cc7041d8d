"""Family: part of the result. Steady state runs the backward of the newest micro-batch instead of the oldest."""
import torch

EXPECT = "ran twice"


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
        forward(warmup + i)
        backward(warmup + i)
    for mb in range(m - warmup, m):
        backward(mb)
