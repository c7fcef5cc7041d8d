"""Family: a flag instead of the behaviour. Forward then backward of each micro-batch in turn: no pipelining at all
(only one stage works at a time)."""

EXPECT = 'all forwards'


def afab_step(pipe):
    for mb in range(pipe.micro_batches):
        pipe.send_forward(mb, pipe.forward_compute(mb, pipe.recv_forward(mb)))
        pipe.send_backward(mb, pipe.backward_compute(mb, pipe.recv_backward(mb)))
