"""Correct, written another way: the schedule listed first (every forward, then every backward), then run."""


def afab_step(pipe):
    m = pipe.micro_batches
    schedule = [("F", mb) for mb in range(m)] + [("B", mb) for mb in range(m)]
    for kind, mb in schedule:
        if kind == "F":
            pipe.send_forward(mb, pipe.forward_compute(mb, pipe.recv_forward(mb)))
        else:
            pipe.send_backward(mb, pipe.backward_compute(mb, pipe.recv_backward(mb)))
