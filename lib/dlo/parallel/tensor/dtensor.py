"""DTensor: the same Megatron split written by PyTorch (``parallelize_module`` and its styles), for the comparison
with the from-scratch layers."""
from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from dlo.models.llama import Llama
from dlo.parallel.tensor.regions import _divisible


def dtensor_llama(full: Llama, mesh, *, sequence_parallel: bool = False) -> nn.Module:
    """A copy of ``full`` parallelised over the 1-D device ``mesh`` with ``parallelize_module``:
    Q/K/V, gate, up and the LM head column-wise; O and down row-wise; the embedding row-wise (its rows
    are the vocabulary). The LM head output is gathered (``Replicate``), so ``model(ids)`` gives the full
    logits and ``model.loss`` works unchanged. Heads must divide like :class:`TPLlama`'s.

    Tied embeddings (``cfg.tie_embeddings``, as in Llama 3.2) stay tied: ``parallelize_module`` gives each
    module its own new sharded parameter, which would silently untie the LM head from the embedding (two
    tensors, two half gradients). Both are sharded the same way (rows = vocabulary, ``Shard(0)``), so the
    head takes the embedding's sharded weight back: one parameter, whose gradient sums both uses.

    ``sequence_parallel``: the plan of :class:`TPLlama`'s ``sequence_parallel=True`` written with DTensor's
    styles: the embedding and the row-parallel layers output ``Shard(1)`` (a reduce-scatter along the
    sequence), ``SequenceParallel()`` on the norms, ``PrepareModuleInput`` gathering the sequence
    (``Shard(1)`` -> ``Replicate()``) in front of attention and the MLP, and the LM head takes ``Shard(1)``."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)

    tp, cfg = mesh.size(), full.cfg
    for what, n in (("num_heads", cfg.num_heads), ("num_kv_heads", cfg.num_kv_heads),
                    ("vocab_size", cfg.vocab_size), ("intermediate_size", cfg.intermediate_size)):
        _divisible(what, n, tp, "dtensor_llama")
    model = copy.deepcopy(full)
    seq = {"output_layouts": Shard(1)} if sequence_parallel else {}
    plan: dict[str, Any] = {
        "embed_tokens": RowwiseParallel(input_layouts=Replicate(), **seq),
        "lm_head": ColwiseParallel(output_layouts=Replicate(), **({"input_layouts": Shard(1)} if seq else {})),
    }
    if sequence_parallel:
        plan["norm"] = SequenceParallel()
    for i in range(len(model.layers)):
        for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"):
            plan[f"layers.{i}.{name}"] = ColwiseParallel()
        for name in ("self_attn.o_proj", "mlp.down_proj"):
            plan[f"layers.{i}.{name}"] = RowwiseParallel(**seq)
        if sequence_parallel:
            for name in ("input_layernorm", "post_attention_layernorm"):
                plan[f"layers.{i}.{name}"] = SequenceParallel()
            plan[f"layers.{i}.self_attn"] = PrepareModuleInput(input_layouts=(Shard(1), None, None),
                                                               desired_input_layouts=(Replicate(), None, None))
            plan[f"layers.{i}.mlp"] = PrepareModuleInput(input_layouts=(Shard(1),),
                                                         desired_input_layouts=(Replicate(),))
    model = parallelize_module(model, mesh, plan)
    if cfg.tie_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    return model


def dtensor_full_tensors(model: nn.Module, *, grads: bool = False) -> dict[str, torch.Tensor]:
    """``{name: full tensor}`` of a :func:`dtensor_llama` model's parameters or gradients."""
    from torch.distributed.tensor import DTensor

    out = {}
    for name, p in model.named_parameters():
        t = p.grad if grads else p
        if t is None:
            raise ValueError(f"parameter {name} has no gradient: run backward first")
        out[name] = (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()
    return out
