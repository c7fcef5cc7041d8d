"""Family: a flag instead of the behaviour. Asks for both inputs (activation and gradient) up front: the forward
would wait for a gradient that needs it."""

EXPECT = "receive each input just before its compute"


def naive_step(pipe):
    x = pipe.recv_forward(0)
    g = pipe.recv_backward(0)
    y = pipe.forward_compute(0, x)
    pipe.send_forward(0, y)
    dx = pipe.backward_compute(0, g)
    pipe.send_backward(0, dx)
