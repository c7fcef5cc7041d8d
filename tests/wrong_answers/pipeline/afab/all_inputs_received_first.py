"""Family: a flag instead of the behaviour. Asks for every micro-batch's input before the first forward: the stage
waits until the previous one has sent them all."""

EXPECT = "receive each input just before its compute"


def afab_step(pipe):
    m = pipe.micro_batches
    inputs = [pipe.recv_forward(mb) for mb in range(m)]
    for mb in range(m):
        pipe.send_forward(mb, pipe.forward_compute(mb, inputs[mb]))
    for mb in range(m):
        pipe.send_backward(mb, pipe.backward_compute(mb, pipe.recv_backward(mb)))
