"""Saves on rank 0 only, as with torch.save: dcp.save is collective, rank 0 waits for the others forever."""
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

EXPECT = ["rank(s) [0] only", "every rank"]


def save_checkpoint(path, model, optimizer, step):
    model_sd, optim_sd = get_state_dict(model, optimizer)
    if dist.get_rank() == 0:
        dcp.save({"model": model_sd, "optim": optim_sd, "step": torch.tensor(step)}, checkpoint_id=str(path))


def load_checkpoint(path, model, optimizer):
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd, "step": torch.tensor(0)}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return int(state["step"])
