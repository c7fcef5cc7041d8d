"""Family: part of the result. range(m - 1): the last micro-batch never runs, its gradient is missing."""

EXPECT = 'never ran'


def afab_step(pipe):
    for mb in range(pipe.micro_batches - 1):
        pipe.send_forward(mb, pipe.forward_compute(mb, pipe.recv_forward(mb)))
    for mb in range(pipe.micro_batches - 1):
        pipe.send_backward(mb, pipe.backward_compute(mb, pipe.recv_backward(mb)))
