"""Goals and hints of the pipeline workshop (pipeline.ipynb, grid.ipynb): see :mod:`dlo.course.hints` for what each level holds."""
from __future__ import annotations

from dlo.course.hints.base import Hint, h as _h

HINTS: dict[tuple[str, str], Hint] = {
    # pipeline
    ("pipeline", "naive"): _h(
        "Run one batch through this pipeline stage: forward and pass the activations on, then backward and pass the "
        "gradient back.",
        "A stage is a link in a chain: it can only compute once the previous stage's output arrives, and its "
        "backward needs the gradient the next stage computed.",
        "pipe.recv_forward, forward_compute, send_forward, recv_backward, backward_compute, send_backward (each "
        "with the micro-batch number).",
        shape="One forward (what comes in, this stage's compute, what goes out), then one backward the same way "
              "in the other direction, each call fed with what the previous one returned."),
    ("pipeline", "afab"): _h(
        "Pipeline the micro-batches GPipe-style: all forwards, then all backwards, in micro-batch order.",
        "Cutting the batch lets the stages work at the same time: while a stage works on one micro-batch, the "
        "previous stage already works on the next; the price is that every micro-batch's activations are kept "
        "until the backwards start.",
        "range(pipe.micro_batches); the six pipe calls with their micro-batch number.",
        shape="A pass over the micro-batches in order, each one received, computed and sent before the next; then "
              "a second pass in the same order for the backwards."),
    ("pipeline", "1f1b"): _h(
        "Schedule the micro-batches 1F1B: a warm-up of forwards, then one forward / one backward, then the "
        "remaining backwards, to bound the activations each stage keeps.",
        "A micro-batch's backward can start as soon as it has gone through the last stage; running it then frees "
        "its activations. A stage far from the end must send a few micro-batches ahead before the first gradient "
        "can come back, a stage near the end fewer, and none can send ahead more micro-batches than exist.",
        "pipe.rank, pipe.world_size, pipe.micro_batches; min; the pipe calls written as receive, compute, send "
        "for each action.",
        shape="Three phases: some forwards only; then pairs of one new forward and one backward of the oldest "
              "micro-batch whose forward is done; then the backwards still owed. How long the first phase is "
              "follows from this stage's distance to the last one -- work it out on a drawing of 4 stages."),
    ("pipeline", "interleaved"): _h(
        "Schedule interleaved 1F1B: each rank holds several chunks, each micro-batch visits every rank several "
        "times, and a step's transfers go out together.",
        "Smaller chunks per stage shorten the fill and drain of the pipeline (a smaller bubble), at the price of "
        "more transfers; those transfers form a ring, so a step must post its receives together and its sends "
        "together or the ranks wait for each other.",
        "The chunk= argument of every pipe call; len(pipe.chunks); a helper that runs a list of actions as "
        "receives, then computes, then sends.",
        shape="An order of this rank's forwards (micro-batches in groups of world_size, each group through chunk "
              "0, then chunk 1, ...) and of its backwards (the same groups, chunks in reverse); a warm-up of "
              "forwards, steady steps of one forward and one backward, a cool-down of backwards."),
    # grid
    ("grid", "coords"): _h(
        "Give a rank's coordinates in the dp x pp x cp x tp grid, and the ranks of its previous and next pipeline "
        "stage that hold the same slice.",
        "Ranks are numbered like the digits of a number whose innermost digit is tp: consecutive ranks differ in "
        "tp first, which keeps tensor parallelism inside a node. Two ranks are pipeline neighbours when they "
        "differ only in their pp digit, by one, and a pipeline has two ends.",
        "divmod (or % and //), in a loop over the axes from the innermost; or torch.arange(world).view(dp, pp, cp, "
        "tp) and its nonzero(); dlo.runtime.grid.Grid to compare with.",
        shape="Coordinates: peel the rank from the innermost axis outwards, each step leaving a remainder (the "
              "coordinate) and a quotient (what the outer axes share). Neighbours: this rank's pp coordinate; "
              "how many ranks one step along pp is (the sizes of the axes inside it); none before the first "
              "stage, none after the last."),
}
