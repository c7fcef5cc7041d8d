"""Correct: the model and optimizer state dicts fetched and set with their own functions; the step as a tensor."""
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict, get_optimizer_state_dict, set_model_state_dict, set_optimizer_state_dict)

import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP


def save_checkpoint(path, model, optimizer, step):
    state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer),
             "step": torch.tensor(step)}
    dcp.save(state, checkpoint_id=str(path))


def load_checkpoint(path, model, optimizer):
    state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer),
             "step": torch.tensor(-1)}
    dcp.load(state, checkpoint_id=str(path))
    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, optimizer, state["optim"])
    return int(state["step"].item())
