"""Wrapping a model for FSDP2: the DDP baseline, mixed-precision and offload policies, activation checkpointing
(full, selective, every k-th layer), per-layer ``torch.compile`` and ``fully_shard``, and whether a unit frees its
gathered weights after forward."""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from dlo.parallel.ddp import ddp_wrap
from dlo.parallel.fsdp.models import decoder_layers


def wrap_ddp(model: nn.Module, ctx, device: torch.device) -> nn.Module:
    """The baseline: model on ``device``, in ``DistributedDataParallel`` when there are several processes
    (the package's one DDP wrapper, :func:`dlo.parallel.ddp.ddp_wrap`)."""
    return ddp_wrap(model, ctx, device=device)


PRECISIONS = ("fp32", "bf16", "bf16-reduce-bf16")


def mixed_precision(precision: str):
    """The ``MixedPrecisionPolicy`` of a precision name, or None (fp32 everywhere).

    * ``"bf16"``: the sharded parameters stay fp32 (the optimizer updates fp32 weights), the all-gathered
      copies used for compute are bf16 (half the all-gather bytes, bf16 Tensor Cores), and gradients are
      reduce-scattered in fp32 (summing many bf16 gradients would lose precision);
    * ``"bf16-reduce-bf16"``: bf16 reduction too (half the reduce-scatter bytes, less exact).
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if precision == "fp32":
        return None
    if precision == "bf16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if precision == "bf16-reduce-bf16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
    raise ValueError(f"unknown precision {precision!r}: choose one of {', '.join(PRECISIONS)}")


def memory_precision(precision: str) -> str:
    """The ``dlo.measure.memory`` precision name that describes a run in ``precision``."""
    return "fp32" if precision == "fp32" else "bf16_mixed"


def offload_policy(device: torch.device | str, enabled: bool):
    """``CPUOffloadPolicy`` (sharded parameters, gradients and optimizer step on the CPU) when enabled.

    Offloading moves state *from GPU memory to CPU memory*: it only means something when training on a GPU.
    Asked for on a CPU run it raises (the model is already in CPU memory)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

    device = torch.device(device)
    if not enabled:
        return OffloadPolicy()
    if device.type != "cuda":
        raise ValueError(f"CPU offload moves the sharded state from GPU to CPU memory, but this run trains on "
                         f"{device}: drop the offload option, or run on GPUs")
    return CPUOffloadPolicy(pin_memory=True)


#: Activation checkpointing modes: ``none``; ``full``: a checkpointed layer keeps only its input and runs its
#: whole forward again in backward; ``selective``: op-level, it keeps the outputs of its matmuls and of
#: attention and recomputes only the element-wise ops (norms, rotary embedding, SiLU, products).
AC_MODES = ("none", "full", "selective")


def checkpoint_mode(value: bool | str | None) -> str:
    """A checkpointing setting as one of :data:`AC_MODES` (True: ``"full"``; False/None: ``"none"``)."""
    if value is None or value is False:
        return "none"
    if value is True:
        return "full"
    if value not in AC_MODES:
        raise ValueError(f"unknown activation checkpointing mode {value!r}: choose one of {', '.join(AC_MODES)}")
    return value


def checkpointed_layers(num_layers: int, mode: bool | str, every: int = 1) -> list[int]:
    """Indices of the decoder layers that ``mode`` checkpoints: every ``every``-th layer (0, k, 2k...)."""
    if not (isinstance(every, int) and every >= 1):
        raise ValueError(f"ac_every must be an integer >= 1 (one layer in k is checkpointed), got {every!r}")
    return [] if checkpoint_mode(mode) == "none" else list(range(0, num_layers, every))


def recomputed_layers(num_layers: int, mode: bool | str, every: int = 1) -> int:
    """Decoder-layer forwards recomputed in backward per step (for the HFU): the checkpointed layers in
    ``full`` mode, 0 in ``selective`` mode (the matmuls are kept, only element-wise ops run again)."""
    return len(checkpointed_layers(num_layers, mode, every)) if checkpoint_mode(mode) == "full" else 0


def _selective_policy():
    """Op-level policy: keep the output of every matmul and of the fused attention kernels, recompute the rest."""
    from torch.utils.checkpoint import CheckpointPolicy

    aten = torch.ops.aten
    names = ("mm", "addmm", "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
             "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu")
    save = {getattr(aten, n).default for n in names if hasattr(aten, n)}

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in save else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def _selective_context():
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(_selective_policy())


def apply_activation_checkpointing(model: nn.Module, mode: bool | str = "full", *, every: int = 1) -> nn.Module:
    """Wrap decoder layers so that (part of) their activations are recomputed in backward instead of stored.

    ``full``: only each layer's input is kept (``hidden`` values per token instead of ~``34 hidden``): memory
    drops, the forward of each layer runs twice (~+33 % compute). ``selective``: the outputs of the matmuls
    and of attention are kept, the element-wise ops are recomputed (about half the memory of no
    checkpointing, almost no extra FLOPs; ``torch.utils.checkpoint.create_selective_checkpoint_contexts``).
    ``every=k``: only layers 0, k, 2k... are wrapped (``none`` leaves the model as it is). Apply it
    *before* ``fully_shard``."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    mode = checkpoint_mode(mode)
    layers = decoder_layers(model)
    extra = {"context_fn": _selective_context} if mode == "selective" else {}
    for i in checkpointed_layers(len(layers), mode, every):
        layers[i] = checkpoint_wrapper(layers[i], preserve_rng_state=False, **extra)
    return model


def compile_layers(model: nn.Module) -> nn.Module:
    """``torch.compile`` each decoder layer in place (``layer.compile()``), before ``fully_shard``.

    Compiling per layer (as torchtitan does) keeps FSDP's per-layer hooks outside the compiled graphs, and
    every layer has the same code, so one compiled graph serves them all."""
    for layer in decoder_layers(model):
        layer.compile()
    return model


def apply_fsdp(model: nn.Module, *, mp_policy=None, reshard_after_forward: bool = True, offload=None,
               mesh=None) -> nn.Module:
    """``fully_shard`` each decoder layer, then the root (embeddings, final norm, tied head)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, OffloadPolicy, fully_shard

    kwargs = dict(mesh=mesh, mp_policy=mp_policy or MixedPrecisionPolicy(), offload_policy=offload or OffloadPolicy())
    for layer in decoder_layers(model):
        fully_shard(layer, reshard_after_forward=reshard_after_forward, **kwargs)
    fully_shard(model, reshard_after_forward=reshard_after_forward, **kwargs)
    return model


def _unit_parameters(module: nn.Module) -> list[nn.Parameter]:
    """The parameters registered under ``module`` that no nested FSDP module owns (its own unit's)."""
    from torch.distributed.fsdp import FSDPModule

    out, stack = [], [module]
    while stack:
        mod = stack.pop()
        out += list(mod.parameters(recurse=False))
        stack += [child for child in mod.children() if not isinstance(child, FSDPModule)]
    return out


def is_resharded_after_forward(module: nn.Module, *, forward: Callable[[], Any] | None = None) -> bool:
    """Whether an FSDP2 module frees its gathered weights after forward (and re-gathers them in backward).

    With ``forward`` (a call that runs one forward through the *root* model, e.g.
    ``lambda: model(input_ids=ids)``) this is observed through public behaviour only: right after the
    module's forward, FSDP2 with ``reshard_after_forward=True`` has registered its sharded ``DTensor``
    parameters again, with ``False`` the module still holds plain unsharded tensors (until its backward).
    The module is resharded afterwards (``FSDPModule.reshard()``), as it is after a training step.

    Without ``forward`` (a module wrapped but not run yet: no public call reports the setting, and running a
    layer on its own would make it a root) the setting is read from FSDP2's state; the test suite checks
    that both answers agree (tests/test_fsdp_prefetch.py)."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    if not isinstance(module, FSDPModule):
        raise ValueError(f"{type(module).__name__} is not an FSDP module: call fully_shard on it first")
    if forward is not None:
        seen: list[bool] = []

        def after(mod, args, output):  # registered after FSDP's own post-forward hook: runs after it
            seen.append(all(isinstance(p, DTensor) for p in _unit_parameters(mod)))

        handle = module.register_forward_hook(after)
        try:
            with torch.no_grad():
                forward()
        finally:
            handle.remove()
            module.reshard()
        if not seen:
            raise ValueError("the forward call never ran this module: pass a call through the root model")
        return seen[0]
    state = module._get_fsdp_state()  # FSDP2 internals: one group in torch 2.4 .. 2.11, a list from 2.12 on
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is None:
        groups = [g for g in [getattr(state, "_fsdp_param_group", None)] if g is not None]
    if not groups:
        raise ValueError("this FSDP module manages no parameters")
    return all(group.post_forward_mesh_info is not None for group in groups)
