"""When FSDP2 issues each layer's all-gather (:func:`set_prefetch`), what the collectives of a step cost
(:class:`CollectiveCounter`, count and bytes), and one training step with gradient accumulation
(:func:`train_step`)."""
from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from dlo.parallel.fsdp.models import decoder_layers, forward_loss


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
