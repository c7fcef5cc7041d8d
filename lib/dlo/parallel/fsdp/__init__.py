"""FSDP2 and DeepSpeed ZeRO helpers: the reference implementation of the tp_fsdp workshop.

DDP keeps a full copy of the weights, gradients and optimizer states on every GPU: 16 bytes per parameter
with AdamW, 51 GB for Llama 3.2 3B before a single activation (``dlo.measure.memory``). **FSDP** (fully sharded
data parallelism, ZeRO-3) keeps only ``1/N`` of each on each of ``N`` GPUs and all-gathers one decoder
layer's weights just before that layer runs (forward and again in backward), then frees them; gradients are
reduce-scattered, so each rank ends with the averaged gradient of *its* shard and updates only that shard.

FSDP2 (``torch.distributed.fsdp.fully_shard``) turns each parameter into a ``DTensor`` sharded on dim 0.
Calling ``fully_shard`` on each decoder layer, then on the root model, makes one communication group per
layer (one all-gather / reduce-scatter each) plus one for what is left (embeddings, final norm, head):
layer ``i+1``'s all-gather is prefetched while layer ``i`` computes (:func:`set_prefetch`).

This module holds the pieces the workshop script (``tp_fsdp/fsdp_train.py``) is checked against:

* models: :func:`model_config` (exact Llama 3.2 3B, or small configs), :func:`build_llama`
  (random init, or ``from_pretrained`` from a local folder);
* wrapping: :func:`wrap_ddp`, :func:`apply_fsdp`, :func:`mixed_precision`, :func:`offload_policy`,
  :func:`apply_activation_checkpointing`, :func:`compile_layers`;
* training: :func:`lm_loss`, :func:`batches`, :func:`train_steps` (timed steps, peak memory, losses),
  :func:`throughput` (tokens/s and MFU through :mod:`dlo.measure.flops`, against the peak of the precision
  the step computes in, :func:`compute_precision`);
* prefetching and communication: :func:`set_prefetch` (FSDP2's default schedule, none, or explicit N layers
  ahead), :class:`CollectiveCounter` (collectives per step, count and bytes), :func:`train_step` (one step,
  for the steady timing of the script's ``--timed-repeats``);
* the levers of a fast step: :func:`build_optimizer` (AdamW for-loop, foreach or fused), gradient accumulation
  (:func:`train_step`'s ``grad_accum``), activation checkpointing of every k-th layer, full or op-level
  selective (:func:`apply_activation_checkpointing`), the chunked loss that never holds the ``tokens x vocab``
  logits (:func:`use_chunked_loss`), the SDPA kernel that ran (:func:`sdpa_backends`);
* sharded checkpoints: :func:`save_sharded`, :func:`load_sharded` (``torch.distributed.checkpoint``; a folder is
  loaded without running anything from it, :func:`read_sharded_metadata`);
* DeepSpeed ZeRO: :func:`deepspeed_config`, :func:`deepspeed_initialize`.
"""
from __future__ import annotations

import contextlib
import functools
import itertools
import math
import os
import re
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from dlo.models.config import LLAMA_3_2_3B, TINY_LLAMA, TransformerConfig
from dlo.data.tokens import rank_loader
from dlo.measure.bench import PeakMemory
from dlo.runtime.device import synchronize
from dlo.measure.flops import flops_per_token, gpu_peak, hardware_flops_per_token, hfu, mfu
from dlo.runtime.validate import per_rank_batch
from dlo.runtime.compat import import_deepspeed
from dlo.parallel.ddp import ddp_wrap

__all__ = ["SMOKE_LLAMA", "MODEL_CONFIGS", "model_config", "build_llama", "decoder_layers", "lm_loss", "wrap_ddp",
           "PRECISIONS", "mixed_precision", "offload_policy", "apply_activation_checkpointing", "compile_layers",
           "apply_fsdp", "is_resharded_after_forward", "PREFETCH_MODES", "set_prefetch",
           "COUNTED_COLLECTIVES", "CollectiveCounter", "train_step", "batches", "train_steps", "compute_precision", "throughput",
           "save_sharded", "load_sharded", "read_sharded_metadata", "UnsafeCheckpoint", "deepspeed_config", "deepspeed_initialize", "full_gradients", "memory_precision",
           "AC_MODES", "checkpoint_mode", "checkpointed_layers", "recomputed_layers", "LOSS_MODES", "ChunkedLossHead",
           "use_chunked_loss", "loss_sum", "forward_loss", "ACCUM_SYNC", "OPTIMIZER_IMPLS", "build_optimizer",
           "optimizer_impl", "sdpa_backends"]

#: The smoke model: a 2-layer Llama (GQA, SwiGLU, tied embeddings like Llama 3.2) of ~0.1 M parameters,
#: small enough for a few CPU training steps per second on 2 gloo processes.
SMOKE_LLAMA = TransformerConfig(vocab_size=256, hidden_size=64, intermediate_size=172, num_layers=2, num_heads=4,
                                num_kv_heads=2, tie_embeddings=True, name="smoke Llama")
MODEL_CONFIGS = {"llama-3.2-3b": LLAMA_3_2_3B, "tiny": TINY_LLAMA, "smoke": SMOKE_LLAMA}


def model_config(name: str) -> TransformerConfig:
    """A named architecture: ``"llama-3.2-3b"`` (exact, 3,212,749,824 parameters), ``"tiny"``, ``"smoke"``."""
    if name not in MODEL_CONFIGS:
        raise ValueError(f"unknown model {name!r}: choose one of {', '.join(MODEL_CONFIGS)}")
    return MODEL_CONFIGS[name]


def build_llama(cfg: TransformerConfig, *, model_path: str | os.PathLike | None = None, seed: int = 0,
                device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                attn_implementation: str = "sdpa") -> nn.Module:
    """transformers' ``LlamaForCausalLM``: random init from ``cfg`` (seeded: identical on every rank), or the
    weights of a local ``model_path`` (``from_pretrained``, no hub access; ``cfg`` is then ignored)."""
    from transformers import LlamaForCausalLM

    if model_path is not None:
        path = Path(model_path).expanduser()
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"model path {model_path} does not exist or has no config.json: give a folder "
                                    "written by save_pretrained (compute nodes cannot download from the hub), "
                                    "or no path for a random init")
        model = LlamaForCausalLM.from_pretrained(str(path), local_files_only=True, torch_dtype=dtype,
                                                 attn_implementation=attn_implementation)
        return model.to(device)
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(cfg.to_hf(attn_implementation=attn_implementation, use_cache=False))
    return model.to(dtype)


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder layers of a transformers causal LM (``model.model.layers``), under DDP/DeepSpeed too."""
    inner = getattr(model, "module", model)
    try:
        return inner.model.layers
    except AttributeError:
        raise ValueError(f"{type(inner).__name__} has no .model.layers: expected a transformers LlamaForCausalLM") from None


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy (labels already shifted by :mod:`dlo.data.tokens`), in fp32.

    Not divided by the world size: DDP, FSDP and DeepSpeed already *average* the gradients over the ranks."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1))


#: How the loss is computed: ``full`` (transformers' head makes the ``tokens x vocab`` logits, upcast to fp32
#: for the cross-entropy) or ``chunked`` (:class:`ChunkedLossHead`).
LOSS_MODES = ("full", "chunked")


def _chunk_loss_sum(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                    labels: torch.Tensor) -> torch.Tensor:
    logits = F.linear(hidden, weight, bias)  # [chunk, vocab] in the compute dtype
    return F.cross_entropy(logits.float(), labels, reduction="sum")  # fp32 for one chunk only


class ChunkedLossHead(nn.Module):
    """Takes the place of a causal LM's ``lm_head``: given the final hidden states, it returns the **sum** of
    the next-token cross-entropies of the labels set by :meth:`targets`, computed ``chunk_tokens`` tokens at
    a time, each chunk under activation checkpointing. The ``tokens x vocab`` logits (1 GB in bf16 for
    4,096 tokens and Llama 3's 128 k vocabulary, plus 2 GB for each fp32 copy the loss makes) never exist:
    one chunk's logits do, and its backward recomputes them. Same value and gradients as the full loss.

    The head runs inside the model's forward, so FSDP's root unit (which owns the tied embedding/head
    weight) has it gathered, as it would for the plain head. Its parameters are the plain head's
    (``weight``, ``bias``): same names, same tied tensor."""

    def __init__(self, head: nn.Linear, chunk_tokens: int = 1024) -> None:
        super().__init__()
        if not (isinstance(chunk_tokens, int) and chunk_tokens >= 1):
            raise ValueError(f"chunk_tokens must be a positive integer, got {chunk_tokens!r}")
        self.weight = head.weight
        self.bias = head.bias
        self.chunk_tokens = chunk_tokens
        self._labels: torch.Tensor | None = None

    @contextlib.contextmanager
    def targets(self, labels: torch.Tensor):
        """The labels of the next forward (``with head.targets(labels): model(input_ids=ids)``)."""
        self._labels = labels
        try:
            yield self
        finally:
            self._labels = None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        if self._labels is None:
            raise RuntimeError("the chunked loss head needs labels: call the model inside `with head.targets(labels):`")
        hidden = hidden.reshape(-1, hidden.shape[-1])
        labels = self._labels.reshape(-1).to(hidden.device)
        if labels.numel() != hidden.shape[0]:
            raise ValueError(f"{labels.numel()} labels for {hidden.shape[0]} tokens")
        total = hidden.new_zeros((), dtype=torch.float32)
        for start in range(0, hidden.shape[0], self.chunk_tokens):
            stop = start + self.chunk_tokens
            total = total + checkpoint(_chunk_loss_sum, hidden[start:stop], self.weight, self.bias,
                                       labels[start:stop], use_reentrant=False)
        return total


def _inner(model: nn.Module) -> nn.Module:
    return getattr(model, "module", model)  # DDP and DeepSpeed keep the model in .module


def use_chunked_loss(model: nn.Module, chunk_tokens: int = 1024) -> nn.Module:
    """Replace the causal LM's ``lm_head`` by a :class:`ChunkedLossHead` (before ``fully_shard``); return it."""
    inner = _inner(model)
    if isinstance(inner.lm_head, ChunkedLossHead):
        inner.lm_head.chunk_tokens = chunk_tokens
    else:
        inner.lm_head = ChunkedLossHead(inner.lm_head, chunk_tokens)
    return model


def loss_sum(model: nn.Module, ids: torch.Tensor, labels: torch.Tensor, *, engine=None,
             autocast_dtype: torch.dtype | None = None) -> torch.Tensor:
    """The sum over tokens of the next-token cross-entropy of ``labels`` (in fp32), through the plain head
    (full logits) or the :class:`ChunkedLossHead` when :func:`use_chunked_loss` installed one."""
    head = _inner(model).lm_head
    net = engine or model
    chunked = isinstance(head, ChunkedLossHead)
    cast = torch.autocast(ids.device.type, dtype=autocast_dtype) if autocast_dtype else contextlib.nullcontext()
    with cast, (head.targets(labels) if chunked else contextlib.nullcontext()):
        out = net(input_ids=ids).logits
    if chunked:
        return out
    return F.cross_entropy(out.float().reshape(-1, out.shape[-1]), labels.reshape(-1), reduction="sum")


def forward_loss(model: nn.Module, ids: torch.Tensor, labels: torch.Tensor, *, engine=None,
                 autocast_dtype: torch.dtype | None = None, tokens: int | torch.Tensor | None = None) -> torch.Tensor:
    """:func:`loss_sum` divided by ``tokens`` (default: this batch's tokens): the mean loss of the batch, or,
    with the token count of a whole batch, one micro-batch's share of it (gradient accumulation)."""
    total = loss_sum(model, ids, labels, engine=engine, autocast_dtype=autocast_dtype)
    return total / (labels.numel() if tokens is None else tokens)


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


# --------------------------------------------------------------------------------------------------
# Prefetching, and what the collectives cost
# --------------------------------------------------------------------------------------------------

#: How the all-gathers of the decoder layers are scheduled (:func:`set_prefetch`).
PREFETCH_MODES = ("default", "none", "explicit")


def _grad_tensors(output: Any) -> list[torch.Tensor]:
    if isinstance(output, torch.Tensor):
        return [output] if output.requires_grad else []
    if isinstance(output, (tuple, list)):
        return [t for item in output for t in _grad_tensors(item)]
    if isinstance(output, dict):
        return [t for item in output.values() for t in _grad_tensors(item)]
    return []


def set_prefetch(model: nn.Module, mode: str, *, depth: int = 2) -> list:
    """Schedule the decoder layers' all-gathers of an FSDP2 model (after :func:`apply_fsdp`); returns the hook
    handles it added (``handle.remove()`` undoes the ``"none"`` mode).

    * ``"default"``: FSDP2's own schedule. In forward the next layer's all-gather is issued when the host
      reaches that layer, on a separate stream, so on a GPU it runs while the kernels of the layer before
      still execute (the host is ahead of the GPU); in backward each layer also issues the all-gather of the
      layer that comes next in backward before computing its own.
    * ``"explicit"``: each layer prefetches the next ``depth`` layers in forward and the previous ``depth`` in
      backward (``FSDPModule.set_modules_to_forward_prefetch`` / ``set_modules_to_backward_prefetch``, as
      torchtitan does): the all-gathers are issued earlier, at the cost of holding ``depth`` more layers.
    * ``"none"``: nothing ahead of time. Each layer is gathered by an explicit ``FSDPModule.unshard()`` on
      the compute stream right before its forward and right before its backward, so the all-gather waits
      for the compute before it and the compute after waits for it. An empty prefetch list means "the
      default" to FSDP2, so backward prefetching is switched off by making each layer prefetch only itself
      (gathered already at that point: nothing happens).
    """
    from torch.distributed.fsdp import FSDPModule

    if mode not in PREFETCH_MODES:
        raise ValueError(f"unknown prefetch mode {mode!r}: choose one of {', '.join(PREFETCH_MODES)}")
    if not (isinstance(depth, int) and depth >= 1):
        raise ValueError(f"prefetch depth must be an integer >= 1 (layers ahead), got {depth!r}")
    layers = list(decoder_layers(model))
    if not all(isinstance(layer, FSDPModule) for layer in layers):
        raise ValueError("set_prefetch needs an FSDP2 model: call apply_fsdp (fully_shard on every layer) first")
    handles: list = []
    if mode == "explicit":
        for i, layer in enumerate(layers):
            layer.set_modules_to_forward_prefetch(layers[i + 1:i + 1 + depth])
            layer.set_modules_to_backward_prefetch(layers[max(0, i - depth):i][::-1])
    elif mode == "none":
        for layer in layers:
            layer.set_modules_to_backward_prefetch([layer])

            def gather_now(mod, args, kwargs=None):
                mod.unshard()  # on the compute stream: after the compute queued before it

            def gather_before_backward(mod, args, output):
                for t in _grad_tensors(output):  # registered before FSDP's own pre-backward hook: runs first
                    t.register_hook(lambda grad, mod=mod: (mod.unshard(), grad)[1])
                return None

            # like FSDP's own hooks, kept out of torch.compile's graphs (a compiled layer runs its hooks too)
            handles.append(layer.register_forward_pre_hook(torch.compiler.disable(gather_now), prepend=True))
            handles.append(layer.register_forward_hook(torch.compiler.disable(gather_before_backward), prepend=True))
    return handles


#: The collectives of ``torch.distributed`` that :class:`CollectiveCounter` counts (FSDP2 calls
#: ``all_gather_single`` / ``reduce_scatter_single`` from torch 2.12 on, ``all_gather_into_tensor`` /
#: ``reduce_scatter_tensor`` before).
COUNTED_COLLECTIVES = ("all_gather_single", "all_gather_into_tensor", "all_gather", "reduce_scatter_single",
                       "reduce_scatter_tensor", "reduce_scatter", "all_reduce", "broadcast", "all_to_all_single",
                       "barrier")


def _collective_bytes(args: tuple, kwargs: dict) -> int:
    sizes = [t.numel() * t.element_size() for t in list(args) + list(kwargs.values()) if isinstance(t, torch.Tensor)]
    for item in list(args) + list(kwargs.values()):
        if isinstance(item, (list, tuple)):
            sizes += [t.numel() * t.element_size() for t in item if isinstance(t, torch.Tensor)]
    return max(sizes, default=0)


class CollectiveCounter:
    """Inside ``with CollectiveCounter() as c:``, every collective called through ``torch.distributed`` (the
    names in :data:`COUNTED_COLLECTIVES`) is counted in ``c.calls``: ``(name, bytes)``, bytes being the
    largest tensor of the call (an all-gather's full output, a reduce-scatter's full input, an
    all-reduce's tensor). The calls themselves are unchanged. A collective called from inside another
    (``all_gather_into_tensor`` calling ``all_gather_single``) counts once."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self._saved: dict[str, Any] = {}
        self._depth = 0

    def _wrap(self, name: str, real: Callable) -> Callable:
        def counted(*args: Any, **kwargs: Any) -> Any:
            if self._depth == 0:
                self.calls.append((name.replace("_single", "").replace("_into_tensor", "").replace("_tensor", ""),
                                   _collective_bytes(args, kwargs)))
            self._depth += 1
            try:
                return real(*args, **kwargs)
            finally:
                self._depth -= 1
        return counted

    def __enter__(self) -> "CollectiveCounter":
        for name in COUNTED_COLLECTIVES:
            real = getattr(dist, name, None)
            if real is not None:
                self._saved[name] = real
                setattr(dist, name, self._wrap(name, real))
        return self

    def __exit__(self, *exc: object) -> None:
        for name, real in self._saved.items():
            setattr(dist, name, real)
        self._saved.clear()

    def summary(self) -> dict[str, dict[str, int]]:
        """``{kind: {"count": n, "bytes": total}}``, e.g. ``{"all_gather": {...}, "reduce_scatter": {...}}``."""
        out: dict[str, dict[str, int]] = {}
        for name, size in self.calls:
            entry = out.setdefault(name, {"count": 0, "bytes": 0})
            entry["count"] += 1
            entry["bytes"] += size
        return out


#: Gradient accumulation: ``last`` reduces the gradients once, after the last micro-batch (DDP's ``no_sync``,
#: FSDP2's ``set_requires_gradient_sync(False)`` before it: the unsharded gradients are held in between);
#: ``every`` reduce-scatters after every micro-batch into the sharded gradients (less memory, N x the traffic).
ACCUM_SYNC = ("last", "every")


@contextlib.contextmanager
def _micro_batch(model: nn.Module, last: bool, sync: str, keep_gathered: bool):
    """Around one micro-batch's forward and backward: whether its gradients are reduced and whether FSDP2
    frees the gathered weights after its backward (``keep_gathered``: not before the last micro-batch)."""
    from torch.distributed.fsdp import FSDPModule

    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(last or sync == "every")
        model.set_reshard_after_backward(last or not keep_gathered)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
            model.set_reshard_after_backward(True)
    elif hasattr(model, "no_sync") and not last and sync == "last":  # DDP
        with model.no_sync():
            yield
    else:
        yield


def train_step(model: nn.Module, optimizer, ids: torch.Tensor, labels: torch.Tensor, *, engine=None,
               autocast_dtype: torch.dtype | None = None, loss_scale: float = 1.0, grad_accum: int = 1,
               accum_sync: str = "last", accum_keep_gathered: bool = False) -> torch.Tensor:
    """One optimizer step (forward, loss, backward, step), the one :func:`train_steps` runs; returns the loss
    (times ``loss_scale``). ``autocast_dtype``: run forward under ``torch.autocast`` in that dtype (the
    compute-only baseline of a bf16 FSDP run, whose gathered weights are bf16).

    ``grad_accum=N``: this rank's batch is split into N micro-batches, each run forward and backward on its
    own (activations of one micro-batch at a time), the optimizer steps once. Each micro-batch's loss is its
    sum over tokens divided by the tokens of the *whole* batch, so the accumulated gradient, and the loss
    returned, are those of the batch in one piece. ``accum_sync`` (:data:`ACCUM_SYNC`) and
    ``accum_keep_gathered`` choose what the micro-batches before the last communicate (FSDP2, DDP)."""
    if grad_accum < 1 or ids.shape[0] % grad_accum:
        raise ValueError(f"grad_accum={grad_accum} must divide this rank's batch of {ids.shape[0]} sequences")
    if accum_sync not in ACCUM_SYNC:
        raise ValueError(f"unknown accum_sync {accum_sync!r}: choose one of {', '.join(ACCUM_SYNC)}")
    if engine is not None:
        if grad_accum != 1:
            raise ValueError("gradient accumulation is configured in DeepSpeed's own config, not here: grad_accum=1")
        loss = forward_loss(model, ids, labels, engine=engine, autocast_dtype=autocast_dtype) * loss_scale
        engine.backward(loss)
        engine.step()
        return loss.detach()
    optimizer.zero_grad(set_to_none=True)
    tokens = labels.numel()
    total = None
    for k, (i, y) in enumerate(zip(ids.chunk(grad_accum), labels.chunk(grad_accum))):
        with _micro_batch(model, k == grad_accum - 1, accum_sync, accum_keep_gathered):
            loss = forward_loss(model, i, y, autocast_dtype=autocast_dtype, tokens=tokens) * loss_scale
            loss.backward()
        total = loss.detach() if total is None else total + loss.detach()
    optimizer.step()
    return total


# --------------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------------

def batches(dataset, global_batch: int, rank: int, world_size: int, *, seed: int = 0, start_step: int = 0,
            device: torch.device | str = "cpu") -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless ``(input_ids, labels)`` batches of this rank, epoch after epoch, from step ``start_step`` on
    (a resumed run sees exactly the batches it would have seen without stopping)."""

    step = 0
    for epoch in itertools.count():
        for ids, labels in rank_loader(dataset, global_batch, rank, world_size, seed=seed, epoch=epoch):
            if step >= start_step:
                yield ids.to(device, non_blocking=True), labels.to(device, non_blocking=True)
            step += 1


def train_steps(model: nn.Module, optimizer, data: Iterator, steps: int, *, device: torch.device | str = "cpu",
                engine=None, warmup: int = 1, track_memory: bool = True, loss_scale: float = 1.0,
                progress: str | None = None, **step_kwargs: Any) -> dict[str, Any]:
    """Run ``steps`` optimizer steps; returns ``losses`` (this rank's), ``step_times_s`` (synchronised),
    ``median_step_s`` (after ``warmup`` steps) and ``peak_memory_bytes`` (``dlo.measure.bench.PeakMemory``).

    ``engine``: a DeepSpeed engine (``engine.backward`` / ``engine.step`` replace ``loss.backward`` and
    ``optimizer.step``). ``loss_scale`` exists for the tests of the "divided by world size" pitfall only.
    ``step_kwargs``: passed to :func:`train_step` (``grad_accum``, ``accum_sync``, ``accum_keep_gathered``)."""

    device = torch.device(device)
    losses, times = [], []
    iterator = range(steps)
    if progress:
        from tqdm.auto import tqdm
        iterator = tqdm(iterator, desc=progress, leave=False)
    with PeakMemory(device) if track_memory else _Null() as mem:
        for _ in iterator:
            ids, labels = next(data)
            synchronize(device)
            start = time.perf_counter()
            loss = train_step(model, optimizer, ids, labels, engine=engine, loss_scale=loss_scale, **step_kwargs)
            synchronize(device)
            times.append(time.perf_counter() - start)
            losses.append(loss.item() / loss_scale)
    timed = times[warmup:] or times
    return {"losses": losses, "step_times_s": times, "median_step_s": statistics.median(timed),
            "peak_memory_bytes": getattr(mem, "peak_bytes", None), "memory_kind": getattr(mem, "kind", None)}


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def compute_precision(precision: str, device: torch.device | str) -> str:
    """The precision the step's matmuls run in, as :func:`dlo.measure.flops.precision_name` spells it, for a
    run in ``precision`` (one of :data:`PRECISIONS`): ``"bf16"`` for the bf16 policies, and for ``"fp32"``
    ``"tf32"`` when TF32 Tensor Cores are switched on for matmuls on a GPU
    (``torch.backends.cuda.matmul.allow_tf32``), else ``"fp32"``."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}: choose one of {', '.join(PRECISIONS)}")
    if precision != "fp32":
        return "bf16"
    tf32 = torch.device(device).type == "cuda" and torch.backends.cuda.matmul.allow_tf32
    return "tf32" if tf32 else "fp32"


def throughput(cfg: TransformerConfig, seq_len: int, global_batch: int, median_step_s: float,
               device: torch.device | str, n_devices: int = 1, *, precision: str,
               gpu_name: str | None = None, recomputed_layers: float = 0) -> dict[str, Any]:
    """tokens/s of the whole run, MFU and HFU (``dlo.measure.flops``) per GPU.

    MFU counts the model's FLOPs (``6N + 12·L·H·S``, non-embedding N), HFU also the ``recomputed_layers``
    layer forwards that activation checkpointing runs again (:func:`recomputed_layers`; 0: HFU = MFU).
    Both divide by the peak of the precision the step computes in (:func:`compute_precision` of
    ``precision``, one of :data:`PRECISIONS`): an fp32 run on an H100 is measured against 67 TFLOP/s, not
    the 989 of bf16, which would report an MFU 15x too low. ``gpu_name``: the name as
    ``torch.cuda.get_device_name`` reports it (default: read from ``device`` when it is a GPU). MFU and HFU
    are None on a CPU or an unknown GPU (no reference peak)."""

    device = torch.device(device)
    tokens_per_s = global_batch * seq_len / median_step_s
    fpt = flops_per_token(cfg, seq_len)
    hw_fpt = hardware_flops_per_token(cfg, seq_len, recomputed_layers=recomputed_layers)
    peak_precision = compute_precision(precision, device)
    if gpu_name is None and device.type == "cuda":
        gpu_name = torch.cuda.get_device_name(device)
    spec = gpu_peak(gpu_name, dtype=peak_precision)
    peak = n_devices * spec.peak_flops if spec else None
    return {"tokens_per_s": tokens_per_s, "flops_per_token": fpt, "hardware_flops_per_token": hw_fpt,
            "recomputed_layers": recomputed_layers, "gpu": spec.name if spec else None,
            "peak_precision": peak_precision, "peak_flops": peak,
            "mfu": mfu(tokens_per_s, fpt, peak) if spec else None,
            "hfu": hfu(tokens_per_s, hw_fpt, peak) if spec else None}


# --------------------------------------------------------------------------------------------------
# The optimizer's implementation, and the attention kernel that ran
# --------------------------------------------------------------------------------------------------

#: AdamW implementations: ``default`` (torch's choice: foreach on GPUs, the for-loop on CPUs), ``foreach``
#: (one kernel per operation for a whole list of tensors), ``fused`` (one kernel for the whole update).
OPTIMIZER_IMPLS = ("default", "foreach", "fused")


def build_optimizer(params, *, lr: float, impl: str = "default", weight_decay: float = 0.0) -> torch.optim.AdamW:
    """``torch.optim.AdamW`` in implementation ``impl`` (:data:`OPTIMIZER_IMPLS`). ``fused`` where the
    parameters' device has no fused kernel: ValueError in one line."""
    if impl not in OPTIMIZER_IMPLS:
        raise ValueError(f"unknown optimizer implementation {impl!r}: choose one of {', '.join(OPTIMIZER_IMPLS)}")
    kwargs = {"foreach": True} if impl == "foreach" else {"fused": True} if impl == "fused" else {}
    params = list(params)
    if impl == "fused":  # torch checks the devices only at the first step: check them now, as torch.optim does
        from torch.optim import optimizer as _optim

        for p in params:
            try:
                _optim._device_dtype_check_for_fused(p)
            except RuntimeError as exc:
                raise ValueError(f"fused AdamW has no kernel for parameters on {p.device.type} in this torch "
                                 f"({str(exc).splitlines()[0]}): use --optimizer-impl foreach") from None
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, **kwargs)


def optimizer_impl(optimizer: torch.optim.Optimizer) -> str:
    """The implementation an AdamW step runs: ``fused``, ``foreach`` or ``for-loop`` (torch's default
    resolved the way ``torch.optim`` resolves it for these parameters)."""
    if optimizer.defaults.get("fused"):
        return "fused"
    foreach = optimizer.defaults.get("foreach")
    if foreach is None:
        from torch.optim.optimizer import _default_to_fused_or_foreach

        params = [p for group in optimizer.param_groups for p in group["params"]]
        _, foreach = _default_to_fused_or_foreach(params, differentiable=False, use_fused=False)
    return "foreach" if foreach else "for-loop"


#: The ATen operator each SDPA backend runs (below autograd, where a dispatch mode sees it).
SDPA_KERNELS = {"_scaled_dot_product_flash_attention": "flash", "_scaled_dot_product_cudnn_attention": "cudnn",
                "_scaled_dot_product_efficient_attention": "efficient",
                "_scaled_dot_product_flash_attention_for_cpu": "flash/cpu",
                "_scaled_dot_product_fused_attention_overrideable": "overrideable"}


def sdpa_backends(forward: Callable[[], Any]) -> list[str]:
    """The SDPA kernels that ``forward()`` (one forward through the model) runs, observed op by op: e.g.
    ``["flash"]`` or ``["cudnn"]`` on an H100 in bf16, ``["flash/cpu"]`` on a CPU, ``["math"]`` when
    ``scaled_dot_product_attention`` fell back to its composite math path (matmuls and softmax; no fused
    kernel ran), ``[]`` when no attention ran at all. Compiled code is run eagerly for the probe
    (``torch.compiler.set_stance("force_eager")``): inductor keeps the SDPA kernel that eager dispatch picks."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: list[str] = []

    class _Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func.__name__.split(".")[0])
            return func(*args, **(kwargs or {}))

    stance = torch.compiler.set_stance("force_eager") if hasattr(torch.compiler, "set_stance") \
        else contextlib.nullcontext()
    with torch.no_grad(), stance, _Ops():
        forward()
    kernels = sorted({SDPA_KERNELS[name] for name in seen if name in SDPA_KERNELS})
    if kernels:
        return kernels
    return ["math"] if any(name in ("_softmax", "_safe_softmax") for name in seen) else []


def full_gradients(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter's full gradient (FSDP's sharded DTensor gradients gathered; DDP's as they are)."""
    out = {}
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        g = p.grad
        if hasattr(g, "full_tensor"):
            g = g.full_tensor()
        out[name.replace("_checkpoint_wrapped_module.", "").replace("module.", "", 1)] = g.detach().clone()
    return out


# --------------------------------------------------------------------------------------------------
# Sharded checkpoints
# --------------------------------------------------------------------------------------------------

def save_sharded(path: str | os.PathLike, model: nn.Module, optimizer, step: int) -> Path:
    """Each rank writes its own shards (``torch.distributed.checkpoint``): no rank ever holds the full model."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd, "step": torch.tensor(step)}, checkpoint_id=str(path))
    return Path(path)


# What the ``.metadata`` pickle of a torch.distributed.checkpoint save may name (found in real saves of torch 2.11 and
# 2.13): the metadata dataclasses, torch sizes, dtypes and layouts, the folder's path. Anything else (os.system,
# builtins.eval, ...) is refused before it is called: torch's own reader unpickles the file with pickle.load.
_DCP_METADATA_GLOBALS = frozenset({
    *(("torch.distributed.checkpoint.metadata", name) for name in (
        "Metadata", "MetadataIndex", "StorageMeta", "TensorStorageMetadata", "BytesStorageMetadata",
        "ChunkStorageMetadata", "TensorProperties", "_MEM_FORMAT_ENCODING")),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.serialization", "_get_layout"),
    ("torch", "Size"),
    *(("pathlib", name) for name in ("PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath")),
})


class UnsafeCheckpoint(ValueError):
    """A sharded checkpoint folder whose files are not what :func:`save_sharded` writes (nothing of it was run)."""


def _metadata_unpickler(file):
    import pickle

    class MetadataUnpickler(pickle.Unpickler):
        def find_class(self, module: str, name: str):
            if (module, name) in _DCP_METADATA_GLOBALS or (
                    module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
                return super().find_class(module, name)
            raise pickle.UnpicklingError(f"it names {module}.{name}, which no checkpoint metadata contains")

    return MetadataUnpickler(file)


def read_sharded_metadata(path: str | os.PathLike, *, file_name: str = ".metadata"):
    """The ``Metadata`` of a sharded checkpoint folder, read without running anything from it.

    torch.distributed.checkpoint reads this file with ``pickle.load``: a crafted folder would run its code in
    every process that loads it. Here only the classes a checkpoint's metadata is made of can be named; the
    shards it points to must be files of the folder itself. Anything else is :class:`UnsafeCheckpoint`,
    one line naming the file."""
    from torch.distributed.checkpoint.metadata import Metadata

    file = Path(path) / file_name
    if not file.is_file():
        raise FileNotFoundError(f"no sharded checkpoint at {path}: {file} does not exist (save one with save_sharded)")
    try:
        with open(file, "rb") as f:
            metadata = _metadata_unpickler(f).load()
    except Exception as exc:  # noqa: BLE001 - any unpickling error of a crafted or damaged file
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise UnsafeCheckpoint(f"{file} is not the metadata of a sharded checkpoint, refused without running "
                               f"it: {reason}") from None
    if not isinstance(metadata, Metadata):
        raise UnsafeCheckpoint(f"{file} is not the metadata of a sharded checkpoint: it holds a "
                               f"{type(metadata).__name__}, not a Metadata")
    for info in (metadata.storage_data or {}).values():
        name = getattr(info, "relative_path", None)
        if not isinstance(name, str) or not name or name != Path(name).name or name in (".", ".."):
            raise UnsafeCheckpoint(f"{file} points outside its folder ({name!r}): refused")
    return metadata


def _safe_dcp_reader(path: str | os.PathLike):
    """A ``FileSystemReader`` that reads the ``.metadata`` with :func:`read_sharded_metadata`."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any):
            rank = kwargs.get("rank")
            name = ".metadata" if rank is None else f"__{rank}.metadata"
            metadata = read_sharded_metadata(self.path, file_name=name)
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeReader(path)


def _safe_load_planner():
    """torch's ``DefaultLoadPlanner``, except that the non-tensor values (the optimizer's ``lr``, ``betas``...)
    are read with ``torch.load(weights_only=True)``: torch's own planner reads them with ``weights_only=False``,
    so a crafted shard file would run code. What passes is plain data, handed on to torch's planner."""
    import io

    from torch.distributed.checkpoint import DefaultLoadPlanner

    class SafeLoadPlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item, value) -> None:
            try:
                obj = torch.load(value, weights_only=True)
            except Exception as exc:  # noqa: BLE001 - any refusal or damage: one line
                text = " ".join(str(exc).split())
                found = re.search(r"WeightsUnpickler error: (.*?\.)( |$)", text)
                reason = found.group(1) if found else text[:200]
                raise UnsafeCheckpoint(f"its value {read_item.dest_index.fqn} is not plain data, refused without "
                                       f"running it: {reason}") from None
            plain = io.BytesIO()
            torch.save(obj, plain)  # checked plain data, written again by us
            plain.seek(0)
            super().load_bytes(read_item, plain)

    return SafeLoadPlanner()


def load_sharded(path: str | os.PathLike, model: nn.Module, optimizer) -> int:
    """Load a :func:`save_sharded` checkpoint into an identically sharded model and optimizer; returns the step.

    Nothing in the folder is run: its ``.metadata`` is checked first (:func:`read_sharded_metadata`, a one-line
    :class:`UnsafeCheckpoint` if it names anything but checkpoint metadata), then read again by the same safe
    reader inside ``dcp.load``, and the non-tensor values are loaded with ``weights_only=True``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    if not Path(path).is_dir():
        raise FileNotFoundError(f"no sharded checkpoint at {path}: save one first (save_sharded)")
    read_sharded_metadata(path)  # every rank, before any collective: a refusal is one line, on every rank
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd, "step": torch.tensor(0)}
    try:
        dcp.load(state, storage_reader=_safe_dcp_reader(path), planner=_safe_load_planner())
    except CheckpointException as exc:  # a BaseException: the ranks' tracebacks, many lines
        refused = [f[0] for f in exc.failures.values() if isinstance(f, tuple) and isinstance(f[0], UnsafeCheckpoint)]
        if refused:
            raise UnsafeCheckpoint(f"sharded checkpoint {path}: {refused[0]}") from None
        raise
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return int(state["step"])


# --------------------------------------------------------------------------------------------------
# DeepSpeed ZeRO
# --------------------------------------------------------------------------------------------------

def deepspeed_config(stage: int, global_batch: int, world_size: int, *, precision: str = "fp32") -> dict[str, Any]:
    """A DeepSpeed JSON config for ZeRO ``stage`` 1 (optimizer states sharded), 2 (+ gradients), 3 (+ weights)."""

    if stage not in (1, 2, 3):
        raise ValueError(f"ZeRO stage must be 1, 2 or 3, got {stage!r}")
    if precision not in ("fp32", "bf16"):
        raise ValueError(f"DeepSpeed precision must be 'fp32' or 'bf16', got {precision!r}")
    return {
        "train_batch_size": global_batch,
        "train_micro_batch_size_per_gpu": per_rank_batch(global_batch, world_size),
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": stage},
        "bf16": {"enabled": precision == "bf16"},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def deepspeed_initialize(model: nn.Module, optimizer, config: dict[str, Any]):
    """``deepspeed.initialize`` with a torch optimizer (nothing JIT-compiled); returns the engine.

    The process group must exist already (``dlo.runtime.distributed.init_distributed``). On a CPU, DeepSpeed would
    JIT-compile a shared-memory collective (~2 min of C++ on 2 cores): it is switched off, gloo is used."""

    deepspeed = import_deepspeed()
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config,
                                           dist_init_required=not dist.is_initialized())
    return engine
