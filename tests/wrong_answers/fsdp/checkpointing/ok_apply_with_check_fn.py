"""Correct: torch's own apply_activation_checkpointing, told which modules are the decoder layers."""
from functools import partial

from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl, apply_activation_checkpointing as apply_ac, checkpoint_wrapper)

import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP


def apply_activation_checkpointing(model):
    layers = set(model.model.layers)
    apply_ac(model, checkpoint_wrapper_fn=partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT),
             check_fn=lambda module: module in layers)
    return model
