"""Family: part of the result. Runs the backwards from the last micro-batch to the first: the neighbour sends them
in the other order."""

EXPECT = 'all backwards 0'


def afab_step(pipe):
    for mb in range(pipe.micro_batches):
        pipe.send_forward(mb, pipe.forward_compute(mb, pipe.recv_forward(mb)))
    for mb in reversed(range(pipe.micro_batches)):
        pipe.send_backward(mb, pipe.backward_compute(mb, pipe.recv_backward(mb)))
