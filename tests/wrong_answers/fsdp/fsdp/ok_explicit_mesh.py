"""Correct, written another way: the device mesh over every process built explicitly and given to each call, the
policies passed only when set."""
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


def apply_fsdp(model, *, mp_policy=None, reshard_after_forward=True, offload=None):
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    options = {"mesh": mesh, "reshard_after_forward": reshard_after_forward}
    if mp_policy is not None:
        options["mp_policy"] = mp_policy
    if offload is not None:
        options["offload_policy"] = offload
    for layer in model.model.layers:
        fully_shard(layer, **options)
    fully_shard(model, **options)
    return model
