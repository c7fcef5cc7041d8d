"""Wraps the whole model in one checkpoint_wrapper: nothing is stored but nothing is sharded per layer either, and the layers stay plain."""
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

EXPECT = "every decoder layer"


def apply_activation_checkpointing(model):
    return checkpoint_wrapper(model, preserve_rng_state=False)
