"""Family: part of the result. world_size - rank forwards of warm-up: one too many on every stage."""
import torch

EXPECT = ["warm-up", "before the first backward, this stage needs"]


def one_f_one_b_step(pipe):
    m = pipe.micro_batches
    warmup = min(pipe.world_size - pipe.rank, m)

    def forward(mb):
        pipe.send_forward(mb, pipe.forward_compute(mb, pipe.recv_forward(mb)))

    def backward(mb):
        pipe.send_backward(mb, pipe.backward_compute(mb, pipe.recv_backward(mb)))

    for mb in range(warmup):
        forward(mb)
    for i in range(m - warmup):
        forward(warmup + i)
        backward(i)
    for mb in range(m - warmup, m):
        backward(mb)
