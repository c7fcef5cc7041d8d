"""Family: inputs that never reach the mistake. Turns gradient synchronisation off on the model (the switch meant for
the micro-steps of gradient accumulation) and never turns it back on: on one process nothing changes, on several no
rank's gradients reach the others and each rank's shard is updated from its own batch only, or not at all."""
from torch.distributed.fsdp import MixedPrecisionPolicy, OffloadPolicy, fully_shard

EXPECT = ["on 2 processes", "reference: dlo.parallel.fsdp.apply_fsdp"]


def apply_fsdp(model, *, mp_policy=None, reshard_after_forward=True, offload=None):
    kwargs = dict(mp_policy=mp_policy or MixedPrecisionPolicy(), offload_policy=offload or OffloadPolicy(),
                  reshard_after_forward=reshard_after_forward)
    for layer in model.model.layers:
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    model.set_requires_gradient_sync(False)
    return model
