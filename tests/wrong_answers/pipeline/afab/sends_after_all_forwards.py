"""Family: a flag instead of the behaviour. Keeps the forward outputs in a list and sends them all after the last
forward: the next stage idles meanwhile."""

EXPECT = "send each result right after its compute"


def afab_step(pipe):
    m = pipe.micro_batches
    outputs = [pipe.forward_compute(mb, pipe.recv_forward(mb)) for mb in range(m)]
    for mb, y in enumerate(outputs):
        pipe.send_forward(mb, y)
    for mb in range(m):
        pipe.send_backward(mb, pipe.backward_compute(mb, pipe.recv_backward(mb)))
