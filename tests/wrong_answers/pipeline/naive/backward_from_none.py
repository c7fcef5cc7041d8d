"""Family: part of the result. Starts every stage's backward from None (as the last stage does): the gradient
received from the next stage is never used."""

EXPECT = ["None", "recv_backward"]


def naive_step(pipe):
    x = pipe.recv_forward(0)
    y = pipe.forward_compute(0, x)
    pipe.send_forward(0, y)
    pipe.recv_backward(0)
    dx = pipe.backward_compute(0, None)
    pipe.send_backward(0, dx)
