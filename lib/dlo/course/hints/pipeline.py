"""Goals and hints of the pipeline workshop (pipeline.ipynb, grid.ipynb): see :mod:`dlo.course.hints` for what each level holds."""
from __future__ import annotations

from dlo.course.hints.base import Hint, h as _h

HINTS: dict[tuple[str, str], Hint] = {
    # pipeline
    ("pipeline", "naive"): _h(
        "Run one batch through this pipeline stage: forward and pass the activations on, then backward and pass the "
        "gradient back.",
        "Each stage receives from the previous one and sends to the next; the backward goes the other way.",
        "pipe.recv_forward, forward_compute, send_forward, then recv_backward, backward_compute, send_backward."),
    ("pipeline", "afab"): _h(
        "Pipeline the micro-batches GPipe-style: all forwards, then all backwards, in micro-batch order.",
        "While a stage works on one micro-batch, the previous stage already works on the next.",
        "Two loops over range(pipe.micro_batches), each call with its micro-batch number; in each loop receive, "
        "compute and send one micro-batch before the next (a transfer waits with the next compute)."),
    ("pipeline", "1f1b"): _h(
        "Schedule the micro-batches 1F1B: a warm-up of forwards, then one forward / one backward, then the "
        "remaining backwards, to bound the activations each stage keeps.",
        "Later stages need fewer warm-up forwards: the warm-up depends on the rank and never exceeds the number of "
        "micro-batches; the backward of the steady state is the oldest pending micro-batch.",
        "warmup = min(world_size - rank - 1, m); the forward and backward helpers written as receive, compute, "
        "send."),
    ("pipeline", "interleaved"): _h(
        "Schedule interleaved 1F1B: each rank holds several chunks, each micro-batch visits every rank several "
        "times, and a step's transfers go out together.",
        "Number the forwards in groups of world_size x chunks; the backward visits the chunks in reverse; in a "
        "steady step post both receives before both computes.",
        "The chunk= argument of every pipe call; a helper running a list of actions as receives, computes, sends."),
}
