"""Family: a flag instead of the behaviour. Runs the backward but never sends the input gradient back: the previous
stage waits forever."""

EXPECT = 'wait for each other forever'


def naive_step(pipe):
    x = pipe.recv_forward(0)
    y = pipe.forward_compute(0, x)
    pipe.send_forward(0, y)
    g = pipe.recv_backward(0)
    pipe.backward_compute(0, g)
