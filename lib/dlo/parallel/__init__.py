"""From-scratch parallelism of the workshops, and the helpers around the library versions.

- ``comm``, ``tensor``: Megatron-style tensor parallelism (autograd-aware collectives, parallel layers).
- ``pipeline/``: stage split (``stages``), NCCL-safe point-to-point transfers and event log (``pipe``), naive /
  GPipe (AFAB) / 1F1B / interleaved schedules (``schedules``), bubble and Gantt (``analysis``); ``p2p_replay``
  replays their transfers under NCCL's matching rules.
- ``grid_step``: the PP × TP × DP capstone -- pipeline stages made of tensor-parallel blocks, transfers between
  the ranks of a :class:`dlo.runtime.grid.Grid` pp group, gradients averaged over its dp group, and the
  communication per axis a layout must show (``comm_theory``).
- ``dp_events``: a rank's timeline of compute spans and all-reduces (launch to completion), for the Gantt charts of
  data parallelism written by hand (Jour2/dp_scratch).
- ``fsdp``: FSDP2 (per-layer ``fully_shard``, mixed precision, activation checkpointing, prefetch modes) and
  DeepSpeed ZeRO.
- ``context``: context parallelism -- load-balanced causal sharding of the sequence, the online-softmax merge,
  ring attention forward and backward (its ``context_worker`` compares it with SDPA on several processes).
- ``experts``: a top-k mixture of experts with capacity and load-balancing loss, and its expert-parallel version
  (``all_to_all`` dispatch and combine; ``experts_worker`` compares it with one process).

Each is the reference the workshop's exercises are checked against, itself tested against a single
process and against PyTorch's own implementation.
"""

from .dp_events import (
    Timeline, agreed_timer, comm_gantt, comm_window_s, elapsed_s, exposed_comm_s, new_marker, record_collectives,
)

__all__ = [
    "Timeline",
    "agreed_timer",
    "comm_gantt",
    "comm_window_s",
    "elapsed_s",
    "exposed_comm_s",
    "new_marker",
    "record_collectives",
]
