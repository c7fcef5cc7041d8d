"""FSDP training runs: each rank's batches, timed steps with peak memory, throughput and MFU against the peak of
the precision the step computes in; the levers of a fast step (AdamW's implementation, the SDPA kernel that ran)
and the full gradients for the comparisons with one process."""
from __future__ import annotations

import contextlib
import itertools
import statistics
import time
from typing import Any, Callable, Iterator

import torch
from torch import nn

from dlo.models.config import TransformerConfig
from dlo.data.tokens import rank_loader
from dlo.measure.bench import PeakMemory
from dlo.runtime.device import synchronize
from dlo.measure.flops import UNKNOWN_GPU, flops_per_token, gpu_peak, hardware_flops_per_token, hfu, mfu
from dlo.parallel.fsdp.wrap import PRECISIONS, recomputed_layers
from dlo.parallel.fsdp.prefetch import train_step


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

    MFU counts the model's FLOPs (``6N + 12·L·H·S``), with N the non-embedding parameters *and the LM head*
    (``flops_per_token(..., include_head=True)``): the convention of torchtitan's and Megatron-LM's MFU figures,
    which the course compares with; ``mfu_no_head`` leaves the head out (the scaling-law convention; the head is
    ~11 % of Llama 3.2 3B's FLOPs at 2,048 tokens). HFU also counts the ``recomputed_layers`` layer forwards that
    activation checkpointing runs again (:func:`recomputed_layers`; 0: HFU = MFU).
    Both divide by the peak of the precision the step computes in (:func:`compute_precision` of
    ``precision``, one of :data:`PRECISIONS`): an fp32 run on an H100 is measured against 67 TFLOP/s, not
    the 989 of bf16, which would report an MFU 15x too low. ``gpu_name``: the name as
    ``torch.cuda.get_device_name`` reports it (default: read from ``device`` when it is a GPU). MFU and HFU
    are None on a CPU or an unknown GPU (no reference peak; ``mfu_note`` then says "unknown GPU: no MFU" and the
    name)."""

    device = torch.device(device)
    tokens_per_s = global_batch * seq_len / median_step_s
    fpt = flops_per_token(cfg, seq_len, include_head=True)
    fpt_no_head = flops_per_token(cfg, seq_len)
    hw_fpt = hardware_flops_per_token(cfg, seq_len, recomputed_layers=recomputed_layers) + (fpt - fpt_no_head)
    peak_precision = compute_precision(precision, device)
    if gpu_name is None and device.type == "cuda":
        gpu_name = torch.cuda.get_device_name(device)
    spec = gpu_peak(gpu_name, dtype=peak_precision)
    peak = n_devices * spec.peak_flops if spec else None
    return {"tokens_per_s": tokens_per_s, "flops_per_token": fpt, "flops_per_token_no_head": fpt_no_head,
            "hardware_flops_per_token": hw_fpt, "mfu_counts": "6N + 12·L·H·S, N with the LM head (as torchtitan, Megatron-LM)",
            "recomputed_layers": recomputed_layers, "gpu": spec.name if spec else None, "gpu_name": gpu_name,
            "mfu_note": None if spec else f"{UNKNOWN_GPU} ({gpu_name or device.type})",
            "peak_precision": peak_precision, "peak_flops": peak,
            "mfu": mfu(tokens_per_s, fpt, peak) if spec else None,
            "mfu_no_head": mfu(tokens_per_s, fpt_no_head, peak) if spec else None,
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
