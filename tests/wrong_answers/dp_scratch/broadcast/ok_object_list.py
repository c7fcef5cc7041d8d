"""Correct: rank 0's whole state dict sent as one object (dist.broadcast_object_list, which pickles it), then loaded
in place on every rank."""
import torch
import torch.distributed as dist


def broadcast_state(model):
    box = [model.state_dict() if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    with torch.no_grad():
        for name, t in model.state_dict().items():
            t.copy_(box[0][name])
