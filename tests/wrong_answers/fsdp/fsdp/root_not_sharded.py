"""Shards every decoder layer but not the root: embeddings, final norm and head stay whole on every rank, outside FSDP."""
from torch.distributed.fsdp import MixedPrecisionPolicy, OffloadPolicy, fully_shard

EXPECT = "root"


def apply_fsdp(model, *, mp_policy=None, reshard_after_forward=True, offload=None):
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=mp_policy or MixedPrecisionPolicy(), offload_policy=offload or OffloadPolicy(),
                    reshard_after_forward=reshard_after_forward)
    return model
