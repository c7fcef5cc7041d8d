"""Two branches, with and without a precision policy: the branch with one forgets reshard_after_forward."""
from torch.distributed.fsdp import OffloadPolicy, fully_shard

EXPECT = ["reshard_after_forward=False", "mp_policy"]


def apply_fsdp(model, *, mp_policy=None, reshard_after_forward=True, offload=None):
    for module in [*model.model.layers, model]:
        if mp_policy is None:
            fully_shard(module, reshard_after_forward=reshard_after_forward, offload_policy=offload or OffloadPolicy())
        else:
            fully_shard(module, mp_policy=mp_policy, offload_policy=offload or OffloadPolicy())
    return model
