"""From-scratch parallelism of the workshops, and the helpers around the library versions.

- ``comm``, ``tensor``: Megatron-style tensor parallelism (autograd-aware collectives, parallel layers).
- ``pipeline/``: stage split (``stages``), NCCL-safe point-to-point transfers and event log (``pipe``), naive /
  GPipe (AFAB) / 1F1B / interleaved schedules (``schedules``), bubble and Gantt (``analysis``); ``p2p_replay``
  replays their transfers under NCCL's matching rules.
- ``fsdp``: FSDP2 (per-layer ``fully_shard``, mixed precision, activation checkpointing) and DeepSpeed ZeRO.

Each is the reference the workshop's exercises are checked against, itself tested against a single
process and against PyTorch's own implementation.
"""
