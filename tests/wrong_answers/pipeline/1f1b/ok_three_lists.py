"""Correct, written another way: the three phases built as lists of actions (warm-up forwards, pairs, cool-down
backwards), the warm-up length counted from the stages after this one."""


def one_f_one_b_step(pipe):
    m = pipe.micro_batches
    stages_after = pipe.world_size - 1 - pipe.rank
    warmup = stages_after if stages_after < m else m
    actions = [("F", mb) for mb in range(warmup)]
    for i in range(m - warmup):
        actions += [("F", warmup + i), ("B", i)]
    actions += [("B", mb) for mb in range(m - warmup, m)]
    for kind, mb in actions:
        if kind == "F":
            x = pipe.recv_forward(mb)
            pipe.send_forward(mb, pipe.forward_compute(mb, x))
        else:
            g = pipe.recv_backward(mb)
            pipe.send_backward(mb, pipe.backward_compute(mb, g))
