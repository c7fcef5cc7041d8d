"""Family: inputs that never reach the mistake. Warm-up of world_size - rank - 1 forwards even when m is smaller:
micro-batches that do not exist."""
import torch

EXPECT = 'does not exist'


def one_f_one_b_step(pipe):
    m = pipe.micro_batches
    warmup = pipe.world_size - pipe.rank - 1

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
