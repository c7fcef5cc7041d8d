"""From-scratch parallelism of the workshops, and the helpers around the library versions.

- ``comm``, ``tensor``: Megatron-style tensor parallelism (autograd-aware collectives, parallel layers).
- ``pipeline``: stage split, point-to-point transfers, naive / GPipe (AFAB) / 1F1B schedules, event log.
- ``fsdp``: FSDP2 (per-layer ``fully_shard``, mixed precision, activation checkpointing) and DeepSpeed ZeRO.

Each is the reference the workshop's exercises are checked against, itself tested against a single
process and against PyTorch's own implementation.
"""
