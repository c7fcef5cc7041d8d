"""Correct, written another way: the forward and the backward each as a helper of its own, called in turn."""


def naive_step(pipe):
    def forward():
        activation = pipe.recv_forward(0)
        pipe.send_forward(0, pipe.forward_compute(0, activation))

    def backward():
        grad = pipe.recv_backward(0)
        pipe.send_backward(0, pipe.backward_compute(0, grad))

    forward()
    backward()
