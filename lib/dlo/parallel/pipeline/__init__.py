"""Pipeline parallelism from scratch: stage split (``stages``), point-to-point transfers and the event log
(``pipe``), schedules (``schedules``), bubble and Gantt (``analysis``).

A model too big for one device is cut into ``p`` **stages** of consecutive layers, one per process.
Micro-batch ``i`` flows forward through stage 0, 1, ..., p-1 (activations sent to the next stage), then
its gradients flow back (activation gradients sent to the previous stage). The order in which each stage
runs its forwards (F) and backwards (B) is the **schedule**:

* ``naive``: the whole batch at once; stage k idles while the others work (bubble ``(p-1)/p``);
* ``afab`` (GPipe): cut the batch into ``m`` micro-batches, all forwards, then all backwards
  (bubble ``(p-1)/(m+p-1)``, but ``m`` micro-batches of activations alive at once);
* ``1f1b``: ``p - rank - 1`` warm-up forwards, then one forward / one backward, then the remaining
  backwards: the same bubble, at most ``p`` micro-batches alive;
* ``interleaved``: each rank holds ``v`` chunks (virtual stages) ``r, r+p, ...``: bubble ``(p-1)/(v*m+p-1)``.

The building blocks a schedule is written with are the methods of :class:`Pipe` (one per rank)::

    x = pipe.recv_forward(i)          # activation of micro-batch i from the previous stage (tokens on stage 0)
    y = pipe.forward_compute(i, x)    # run the stage, keep what backward needs, log an F event
    pipe.send_forward(i, y)           # to the next stage (nothing on the last stage: y is the loss)
    g = pipe.recv_backward(i)         # gradient of y from the next stage (None on the last stage)
    dx = pipe.backward_compute(i, g)  # backward through the stage, log a B event, free micro-batch i
    pipe.send_backward(i, dx)         # gradient of x to the previous stage (nothing on stage 0)

Each micro-batch's loss is divided by ``m`` and the gradients accumulate in ``.grad`` over the
micro-batches, so one pipeline step gives the gradient of the mean loss of the whole batch: the same
as one process running the whole model (tested, fp32). The transfers use fixed shapes
``[micro_batch, seq, hidden]`` known in advance (no shape message needed).

**When the transfers go out.** A ``send_*`` or ``recv_*`` call only *asks* for a transfer. The Pipe posts
every transfer asked for since the previous compute **together**, in one ``batch_isend_irecv``, right
before the next ``forward_compute`` / ``backward_compute`` (and the last ones in :meth:`Pipe.finish`);
the tensor a ``recv_*`` returns is filled by then. This matters on GPUs: with NCCL a large send (beyond
NCCL's internal buffer, a few MiB) does not complete until the receiver has posted the matching receive,
and between two ranks NCCL pairs the n-th send with the n-th receive, whatever the tags. Posted one by
one, 1F1B's "send my activation, then receive a gradient" on one rank and "send my gradient, then
receive an activation" on its neighbour wait for each other forever. Posted together (what Megatron-LM's
``send_forward_recv_backward`` does), both complete. :mod:`dlo.parallel.p2p_replay` replays every
schedule's transfers under NCCL's rules to show it cannot deadlock.
"""
from __future__ import annotations

from .stages import (
    micro_batch_size, check_world_size, split_layers, Stage, split_model, build_stage, build_chunks,
)
from .pipe import Event, StepStats, Transfer, Pipe
from .schedules import (
    SCHEDULE_NAMES, SCHEDULES, naive_step, afab_step, one_f_one_b_actions, one_f_one_b_step, interleaved_warmup,
    interleaved_actions, interleaved_steps, interleaved_step, train_step,
)
from .analysis import gather_stats, bubble_theory, bubble_fraction, gantt

__all__ = ["SCHEDULE_NAMES", "micro_batch_size", "check_world_size", "split_layers", "Stage", "split_model",
           "build_stage", "build_chunks", "Event", "StepStats", "Pipe", "naive_step", "afab_step",
           "one_f_one_b_actions", "one_f_one_b_step", "interleaved_warmup", "interleaved_actions", "interleaved_steps",
           "interleaved_step", "SCHEDULES", "Transfer",
           "train_step", "gather_stats", "bubble_theory", "bubble_fraction", "gantt"]
