"""Correct: the units listed first (every decoder layer, then the root), one fully_shard call per unit with the
same options, the default policies written out."""
from torch.distributed.fsdp import MixedPrecisionPolicy, OffloadPolicy, fully_shard


def apply_fsdp(model, *, mp_policy=None, reshard_after_forward=True, offload=None):
    units = list(model.model.layers) + [model]
    for unit in units:
        fully_shard(unit, mp_policy=mp_policy if mp_policy is not None else MixedPrecisionPolicy(),
                    reshard_after_forward=reshard_after_forward,
                    offload_policy=offload if offload is not None else OffloadPolicy())
    return model
