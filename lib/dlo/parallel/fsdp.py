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
* sharded checkpoints: :func:`save_sharded`, :func:`load_sharded` (``torch.distributed.checkpoint``);
* DeepSpeed ZeRO: :func:`deepspeed_config`, :func:`deepspeed_initialize`.
"""
from __future__ import annotations

import itertools
import os
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
from dlo.measure.flops import flops_per_token, gpu_peak, mfu
from dlo.runtime.validate import per_rank_batch
from dlo.runtime.compat import import_deepspeed
from dlo.parallel.ddp import ddp_wrap

__all__ = ["SMOKE_LLAMA", "MODEL_CONFIGS", "model_config", "build_llama", "decoder_layers", "lm_loss", "wrap_ddp",
           "PRECISIONS", "mixed_precision", "offload_policy", "apply_activation_checkpointing", "compile_layers",
           "apply_fsdp", "is_resharded_after_forward", "PREFETCH_MODES", "set_prefetch",
           "COUNTED_COLLECTIVES", "CollectiveCounter", "train_step", "batches", "train_steps", "compute_precision", "throughput",
           "save_sharded", "load_sharded", "deepspeed_config", "deepspeed_initialize", "full_gradients", "memory_precision"]

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


def apply_activation_checkpointing(model: nn.Module) -> nn.Module:
    """Wrap each decoder layer so that its activations are recomputed in backward instead of stored.

    Only each layer's input is kept (``hidden`` values per token instead of ~``34 hidden``): memory drops,
    the forward of each layer runs twice (~+33 % compute). Apply it *before* ``fully_shard``."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    layers = decoder_layers(model)
    for i, layer in enumerate(layers):
        layers[i] = checkpoint_wrapper(layer, preserve_rng_state=False)
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


def train_step(model: nn.Module, optimizer, ids: torch.Tensor, labels: torch.Tensor, *, engine=None,
               autocast_dtype: torch.dtype | None = None, loss_scale: float = 1.0) -> torch.Tensor:
    """One optimizer step (forward, loss, backward, step), the one :func:`train_steps` runs; returns the loss
    (times ``loss_scale``). ``autocast_dtype``: run forward under ``torch.autocast`` in that dtype (the
    compute-only baseline of a bf16 FSDP run, whose gathered weights are bf16)."""
    if autocast_dtype is not None:
        with torch.autocast(ids.device.type, dtype=autocast_dtype):
            logits = (engine or model)(input_ids=ids).logits
    else:
        logits = (engine or model)(input_ids=ids).logits
    loss = lm_loss(logits, labels) * loss_scale
    if engine is not None:
        engine.backward(loss)
        engine.step()
    else:
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return loss.detach()


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
                progress: str | None = None) -> dict[str, Any]:
    """Run ``steps`` optimizer steps; returns ``losses`` (this rank's), ``step_times_s`` (synchronised),
    ``median_step_s`` (after ``warmup`` steps) and ``peak_memory_bytes`` (``dlo.measure.bench.PeakMemory``).

    ``engine``: a DeepSpeed engine (``engine.backward`` / ``engine.step`` replace ``loss.backward`` and
    ``optimizer.step``). ``loss_scale`` exists for the tests of the "divided by world size" pitfall only."""

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
            loss = train_step(model, optimizer, ids, labels, engine=engine, loss_scale=loss_scale)
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
               gpu_name: str | None = None) -> dict[str, Any]:
    """tokens/s of the whole run and MFU (``dlo.measure.flops``: ``6N + 12·L·H·S``, non-embedding N) per GPU.

    The MFU divides by the peak of the precision the step computes in (:func:`compute_precision` of
    ``precision``, one of :data:`PRECISIONS`): an fp32 run on an H100 is measured against 67 TFLOP/s, not
    the 989 of bf16, which would report an MFU 15x too low. ``gpu_name``: the name as
    ``torch.cuda.get_device_name`` reports it (default: read from ``device`` when it is a GPU). MFU is None
    on a CPU or an unknown GPU (no reference peak)."""

    device = torch.device(device)
    tokens_per_s = global_batch * seq_len / median_step_s
    fpt = flops_per_token(cfg, seq_len)
    peak_precision = compute_precision(precision, device)
    if gpu_name is None and device.type == "cuda":
        gpu_name = torch.cuda.get_device_name(device)
    spec = gpu_peak(gpu_name, dtype=peak_precision)
    return {"tokens_per_s": tokens_per_s, "flops_per_token": fpt, "gpu": spec.name if spec else None,
            "peak_precision": peak_precision, "peak_flops": n_devices * spec.peak_flops if spec else None,
            "mfu": mfu(tokens_per_s, fpt, n_devices * spec.peak_flops) if spec else None}


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


def load_sharded(path: str | os.PathLike, model: nn.Module, optimizer) -> int:
    """Load a :func:`save_sharded` checkpoint into an identically sharded model and optimizer; returns the step."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    if not Path(path).is_dir():
        raise FileNotFoundError(f"no sharded checkpoint at {path}: save one first (save_sharded)")
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd, "step": torch.tensor(0)}
    dcp.load(state, checkpoint_id=str(path))
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
