"""dcp.load fills the dict, but set_state_dict is never called: the model keeps its weights."""
import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP
from pathlib import Path

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

EXPECT = 'weights differ'


def save_checkpoint(path, model, optimizer, step):
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd, "step": torch.tensor(step)}, checkpoint_id=str(path))


def load_checkpoint(path, model, optimizer):
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": {k: v.clone() for k, v in model_sd.items()}, "optim": optim_sd, "step": torch.tensor(0)}
    dcp.load(state, checkpoint_id=str(path))
    return int(state["step"])
