"""Family: inputs that never reach the mistake. Borrows the interleaved schedule's special case: with as many
micro-batches as stages it runs every forward first (AFAB's order, m activations held on every stage) instead of
1F1B's warm-up; right whenever m != p."""

EXPECT = ["warm-up", "before the first backward, this stage needs"]


def one_f_one_b_step(pipe):
    m, p = pipe.micro_batches, pipe.world_size
    warmup = m if m == p else min(p - pipe.rank - 1, m)

    def forward(mb):
        pipe.send_forward(mb, pipe.forward_compute(mb, pipe.recv_forward(mb)))

    def backward(mb):
        pipe.send_backward(mb, pipe.backward_compute(mb, pipe.recv_backward(mb)))

    for mb in range(warmup):
        forward(mb)
    for i in range(m - warmup):
        forward(warmup + i)
        backward(i)
    for mb in range(m - warmup, m):
        backward(mb)
