"""From-scratch parallelism of the workshops, and the helpers around the library versions.

- ``comm``, ``tensor``: Megatron-style tensor parallelism (autograd-aware collectives, parallel layers).
- ``pipeline/``: stage split (``stages``), NCCL-safe point-to-point transfers and event log (``pipe``), naive /
  GPipe (AFAB) / 1F1B / interleaved schedules (``schedules``), bubble and Gantt (``analysis``); ``p2p_replay``
  replays their transfers under NCCL's matching rules.
- ``dp_events``: a rank's timeline of compute spans and all-reduces (launch to completion), for the Gantt charts of
  data parallelism written by hand (Jour2/dp_scratch).
- ``fsdp``: FSDP2 (per-layer ``fully_shard``, mixed precision, activation checkpointing) and DeepSpeed ZeRO.

Each is the reference the workshop's exercises are checked against, itself tested against a single
process and against PyTorch's own implementation.
"""

from .dp_events import (
    Timeline, agreed_timer, comm_gantt, elapsed_s, exposed_comm_s, new_marker, record_collectives,
)

__all__ = [
    "Timeline",
    "agreed_timer",
    "comm_gantt",
    "elapsed_s",
    "exposed_comm_s",
    "new_marker",
    "record_collectives",
]
