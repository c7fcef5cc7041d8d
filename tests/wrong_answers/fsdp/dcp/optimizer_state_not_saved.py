"""Saves and loads the model only: the AdamW moments restart from zero."""
import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP
from pathlib import Path

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

EXPECT = 'optimizer state'


def save_checkpoint(path, model, optimizer, step):
    model_sd, _ = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "step": torch.tensor(step)}, checkpoint_id=str(path))


def load_checkpoint(path, model, optimizer):
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "step": torch.tensor(0)}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=optim_sd)
    return int(state["step"])
