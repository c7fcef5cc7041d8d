"""Correct: the state built by one helper for both directions, the step kept as a 0-d int64 tensor, the checkpoint
folder given as a path string."""
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict


def _state(model, optimizer, step):
    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {"model": model_sd, "optim": optim_sd, "step": torch.tensor(step, dtype=torch.int64)}


def save_checkpoint(path, model, optimizer, step):
    dcp.save(_state(model, optimizer, step), checkpoint_id=str(path))


def load_checkpoint(path, model, optimizer):
    state = _state(model, optimizer, 0)
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return int(state["step"].item())
