"""DistributedDataParallel (DDP), seen from the inside: buckets, hooks, unused parameters, metrics.

DDP in one paragraph: every rank holds a full copy of the model and trains on its own slice of the
global batch. During ``loss.backward()``, DDP groups the gradients into *buckets* (about
``bucket_cap_mb`` MiB each) and, as soon as every gradient of a bucket is ready, launches an
all-reduce of that bucket that *averages* it across ranks, while autograd keeps computing the
gradients of earlier layers. When ``backward()`` returns, every rank has the same averaged gradients,
so the same optimizer step keeps the copies identical. The result is mathematically the training of
one process on the concatenated batch (see ``tests/test_ddp.py``), as long as

* the loss is a *mean* over the local batch and is not divided by the world size again: DDP already
  averages, a second division halves (for 2 ranks) every gradient;
* every rank sees a different slice of the data (``DistributedSampler``, with ``set_epoch`` each epoch);
* the model has no per-batch statistics (BatchNorm computes its mean and variance per rank unless it is
  converted with ``nn.SyncBatchNorm.convert_sync_batchnorm``, which only runs on GPUs);
* every parameter takes part in every backward, or ``find_unused_parameters=True`` is passed.

This module gives the notebook a way to *see* these things:

* :class:`CommRecorder` / :func:`attach_comm_recorder`: a communication hook that does what DDP does by
  default (average each bucket with an all-reduce) and records, per bucket, its size and how long its
  all-reduce took;
* :class:`ConditionalHeadsNet` (breaks DDP without ``find_unused_parameters=True``) and
  :class:`StochasticDepthNet` (drops blocks at random, yet needs no flag);
* :func:`reduce_sum` / :func:`reduce_mean` for metrics, :func:`ddp_wrap`, :func:`check_batch_divisible`
  and :func:`per_rank_batch`.

Typical worker script (launched with ``dlo.runtime.launch.launch``)::

    with distributed() as ctx:
        for cap in (1, 25, 100):
            model = ddp_wrap(resnet18_cifar().to(pick_device()), ctx, bucket_cap_mb=cap)
            recorder = attach_comm_recorder(model)
            ...  # a few training steps
            for step in recorder.summary(skip_first=True):
                write_record({"bucket_cap_mb": cap, **step})   # buckets, bytes, comm_s, span_s per step

No ``from __future__ import annotations`` here on purpose: ``DistributedDataParallel.register_comm_hook``
inspects the hook's annotations and rejects string annotations, so the hook below has none.
"""
from __future__ import annotations
import threading
import time
from typing import Any, Optional, Union

import torch
import torch.distributed as dist
from torch import nn


# ----------------------------------------------------------------------------------------------------
# The communication view: a comm hook that records every bucket's all-reduce
# ----------------------------------------------------------------------------------------------------
class CommRecorder:
    """What DDP communicated, bucket by bucket, step by step. Create it with :func:`attach_comm_recorder`.

    Each all-reduce DDP launches becomes one record (a dict) in :attr:`records`:

    ``step``
        the backward pass it belongs to, counted by the recorder itself (0, 1, 2...). A step ends with the
        bucket whose ``is_last()`` is true: DDP launches buckets strictly in index order, so no help from
        the caller is needed. Backward passes under ``ddp_model.no_sync()`` communicate nothing and are
        not counted. :meth:`next_step` is only needed to force a new step number by hand.
    ``bucket``
        ``bucket.index()``; bucket 0 holds the *last* layers, whose gradients are ready first.
    ``params``, ``elements``, ``bytes``, ``dtype``, ``param_names``
        what the bucket carries: number of parameter tensors, number of values, their size in bytes.
    ``comm_s``
        time of this bucket's all-reduce, from its launch to its completion. On CPU (gloo) it is wall
        time (``time.perf_counter``) measured in the future's completion callback. On CUDA it comes from
        two CUDA events (one recorded before the launch, one in the completion callback, which runs in
        stream order after the collective), read lazily once the work is done, because reading an
        event right away would force a synchronisation in the middle of ``backward()``.
        Collectives run one after the other on the communication thread (gloo) or stream (NCCL), so
        ``comm_s`` includes waiting for the earlier buckets.
    ``start_s``, ``end_s``
        launch and completion time relative to the first launch of the same step. In :meth:`summary`,
        ``span_s`` (the last ``end_s``) is the communication *window* of a step: it also contains the
        backward computation between launches, which is precisely what DDP overlaps with communication.

    The bucket layout of step 0 is not the final one. On the first backward DDP does not know in which
    order the gradients will become ready, so (torch 2.x, unless ``find_unused_parameters=True``) it
    puts every parameter into *one* bucket, in ``model.parameters()`` order, and launches one all-reduce
    at the very end of ``backward()``: no overlap at all. It meanwhile notes the order in which gradients
    arrived and, before the second forward, *rebuilds* buckets of ``bucket_cap_mb`` MiB in that order
    (the first one only 1 MiB, ``dist._DEFAULT_FIRST_BUCKET_BYTES``, so that the first all-reduce
    starts early; recent versions do so only when ``bucket_cap_mb`` is left to its default). With ``find_unused_parameters=True`` the
    buckets are sized from the start and never rebuilt. Step 0 is recorded, but look at the steps
    after it for the real layout (``summary(skip_first=True)``).
    """

    def __init__(self, process_group=None, names: Optional[dict] = None) -> None:
        self.process_group = process_group
        self._names = dict(names or {})  # id(parameter) -> qualified name, to show what a bucket holds
        self._lock = threading.Lock()
        self._raw: list[dict] = []
        self._step = 0
        self._step_done = False  # the last bucket of the current step was launched: the next bucket opens a step
        self._step_origin: dict[int, Any] = {}  # step -> perf_counter value or CUDA event of its first launch

    # -- called by the hook ------------------------------------------------------------------------
    def _open(self, bucket, tensor: torch.Tensor) -> dict:
        with self._lock:
            if self._step_done:
                self._step += 1
                self._step_done = False
            step = self._step
            if bucket.is_last():
                self._step_done = True
            params = list(bucket.parameters())
            raw = {
                "step": step,
                "bucket": int(bucket.index()),
                "params": len(params),
                "elements": int(tensor.numel()),
                "bytes": int(tensor.numel() * tensor.element_size()),
                "dtype": str(tensor.dtype).removeprefix("torch."),
                "param_names": [self._names.get(id(p), "?") for p in params],
                "device": tensor.device.type,
            }
            if tensor.is_cuda:
                raw["_start"] = torch.cuda.Event(enable_timing=True)
                raw["_start"].record()
                raw["_end"] = torch.cuda.Event(enable_timing=True)
                self._step_origin.setdefault(step, raw["_start"])
            else:
                raw["_t0"] = time.perf_counter()
                self._step_origin.setdefault(step, raw["_t0"])
            self._raw.append(raw)
        return raw

    @staticmethod
    def _close(raw: dict) -> None:
        if "_end" in raw:
            raw["_end"].record()  # in stream order: after the collective, without waiting for it on the host
        else:
            raw["_t1"] = time.perf_counter()
        raw["_done"] = True

    # -- what the notebook reads -------------------------------------------------------------------
    def next_step(self) -> None:
        """Start a new step number by hand (normally unnecessary: the last bucket of a backward ends a step)."""
        with self._lock:
            if self._raw and self._raw[-1]["step"] == self._step:
                self._step += 1
            self._step_done = False

    def clear(self) -> None:
        """Forget every record (e.g. after warm-up steps); step numbers continue."""
        with self._lock:
            self._raw.clear()
            self._step_origin.clear()

    @property
    def steps(self) -> int:
        """Number of steps recorded so far."""
        with self._lock:
            return len({r["step"] for r in self._raw})

    @property
    def records(self) -> list[dict]:
        """One dict per bucket all-reduce (see the class docstring). Waits for CUDA events if needed."""
        with self._lock:
            raws = list(self._raw)
            origins = dict(self._step_origin)
        out = []
        for raw in raws:
            record = {k: v for k, v in raw.items() if not k.startswith("_")}
            if not raw.get("_done"):  # still in flight (read during backward): no time yet
                record.update(comm_s=None, start_s=None, end_s=None)
            elif "_end" in raw:
                origin = origins.get(raw["step"], raw["_start"])
                raw["_end"].synchronize()
                record["comm_s"] = raw["_start"].elapsed_time(raw["_end"]) / 1000.0
                record["start_s"] = origin.elapsed_time(raw["_start"]) / 1000.0 if origin is not raw["_start"] else 0.0
                record["end_s"] = origin.elapsed_time(raw["_end"]) / 1000.0
            else:
                origin = origins.get(raw["step"], raw["_t0"])
                record["comm_s"] = raw["_t1"] - raw["_t0"]
                record["start_s"] = raw["_t0"] - origin
                record["end_s"] = raw["_t1"] - origin
            out.append(record)
        return out

    def summary(self, skip_first: bool = False) -> list[dict]:
        """One dict per step: ``buckets``, ``params``, ``elements``, ``bytes``, ``comm_s`` (sum of the
        buckets' times) and ``span_s`` (first launch to last completion, the communication window of the
        step). ``skip_first=True`` leaves out step 0, whose bucket layout is not the final one."""
        steps: dict[int, dict] = {}
        for r in self.records:
            if skip_first and r["step"] == 0:
                continue
            s = steps.setdefault(
                r["step"], {"step": r["step"], "buckets": 0, "params": 0, "elements": 0, "bytes": 0, "comm_s": 0.0,
                            "span_s": 0.0}
            )
            s["buckets"] += 1
            s["params"] += r["params"]
            s["elements"] += r["elements"]
            s["bytes"] += r["bytes"]
            if r["comm_s"] is None:
                s["comm_s"] = s["span_s"] = None
            elif s["comm_s"] is not None:
                s["comm_s"] += r["comm_s"]
                s["span_s"] = max(s["span_s"], r["end_s"])
        return [steps[k] for k in sorted(steps)]

    def __repr__(self) -> str:
        with self._lock:
            n = len(self._raw)
        return f"CommRecorder({n} bucket all-reduces over {self.steps} step(s))"


def _recording_allreduce_hook(state, bucket):
    """DDP's default behaviour (average the bucket across ranks, asynchronously), plus a record.

    No annotations: ``register_comm_hook`` compares them with ``dist.GradBucket`` and rejects anything
    else, string annotations included. Same arithmetic as the built-in reduction: divide by the world
    size, then all-reduce with SUM. With a comm hook registered, DDP no longer pre-divides the
    gradients: the hook must do it.
    """
    recorder: CommRecorder = state
    tensor = bucket.buffer()
    raw = recorder._open(bucket, tensor)
    group = recorder.process_group if recorder.process_group is not None else dist.group.WORLD
    tensor.div_(dist.get_world_size(group))
    fut = dist.all_reduce(tensor, group=group, async_op=True).get_future()

    def done(f):
        recorder._close(raw)
        return f.value()[0]

    return fut.then(done)


def attach_comm_recorder(ddp_model: nn.Module, *, process_group=None) -> CommRecorder:
    """Register a recording all-reduce hook on ``ddp_model`` (a ``DistributedDataParallel``) and return its recorder.

    Call it right after wrapping and before the first backward: DDP accepts one comm hook per model, once.
    Training results are those of the default hook (same division, same all-reduce), so it can stay on.
    ``process_group`` defaults to the model's own group.
    """
    if not isinstance(ddp_model, nn.parallel.DistributedDataParallel):
        raise ValueError(
            f"attach_comm_recorder needs a DistributedDataParallel model, got {type(ddp_model).__name__}: "
            "wrap it first (ddp_wrap(model, ctx))"
        )
    group = process_group if process_group is not None else getattr(ddp_model, "process_group", None)
    names = {id(p): name for name, p in ddp_model.module.named_parameters()}
    recorder = CommRecorder(process_group=group, names=names)
    ddp_model.register_comm_hook(recorder, _recording_allreduce_hook)
    return recorder


# ----------------------------------------------------------------------------------------------------
# Metrics across ranks, wrapping, batch sizes
# ----------------------------------------------------------------------------------------------------
def _group_active(group) -> bool:
    return dist.is_available() and dist.is_initialized()


def reduce_sum(value: Union[torch.Tensor, float, int], group=None) -> Union[torch.Tensor, float]:
    """Sum of ``value`` over the ranks of ``group`` (default: all), returned on every rank.

    A tensor gives a new tensor of the same dtype (the input is left alone), a number gives a float.
    Without a process group (a single process) it returns the value itself: the same script works with
    and without torchrun. Every rank must call it, with the same shape, or the others wait forever.
    """
    if isinstance(value, torch.Tensor):
        if not _group_active(group):
            return value.detach().clone()
        tensor = value.detach().clone()
        backend = dist.get_backend(group)
        if backend == "nccl" and tensor.device.type != "cuda":  # NCCL only moves CUDA tensors
            out = tensor.to(torch.device("cuda", torch.cuda.current_device()))
            dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
            return out.to(tensor.device)
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
        return tensor
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"reduce_sum expects a tensor or a number, got {type(value).__name__}")
    if not _group_active(group):
        return float(value)
    return reduce_sum(torch.tensor([float(value)], dtype=torch.float64), group=group).item()


def reduce_mean(value: Union[torch.Tensor, float, int], group=None) -> Union[torch.Tensor, float]:
    """Mean of ``value`` over the ranks (sum divided by the world size); see :func:`reduce_sum`.

    For a metric such as accuracy, prefer summing counts (correct, seen) with :func:`reduce_sum` and
    dividing at the end: the mean of per-rank means is only right when every rank saw as many samples.
    """
    if isinstance(value, torch.Tensor) and not (value.is_floating_point() or value.is_complex()):
        value = value.to(torch.float64)  # the mean of integers is not an integer
    total = reduce_sum(value, group=group)
    world = dist.get_world_size(group) if _group_active(group) else 1
    return total / world


def ddp_wrap(
    model: nn.Module, ctx=None, *, device: Union[str, torch.device, None] = None, **ddp_kwargs: Any
) -> nn.Module:
    """Wrap ``model`` in ``DistributedDataParallel`` with ``device_ids`` right for where it lives.

    * ``device`` (optional) moves the model first; otherwise the model stays where its parameters are.
    * On a GPU, DDP wants ``device_ids=[index]`` (this process's own GPU; with ``init_distributed`` it is
      ``torch.cuda.current_device()``); on the CPU it wants ``device_ids=None``. Passing the GPU list
      for a CPU model, or forgetting it on GPU, are classic first errors.
    * ``ddp_kwargs`` go to DDP (``bucket_cap_mb``, ``find_unused_parameters``, ``static_graph``...).
    * ``ctx`` (a :class:`dlo.runtime.distributed.DistContext`) is optional: with a world of one and no process group the
      model is returned unwrapped, so that one script also runs as a single plain process.
    """
    if device is not None:
        model = model.to(device)
    world = ctx.world_size if ctx is not None else None
    if not (dist.is_available() and dist.is_initialized()):
        if world in (None, 1):
            return model
        raise RuntimeError(
            f"the context says world size {world} but no process group exists: call init_distributed() "
            "(or `with distributed() as ctx:`) before ddp_wrap"
        )
    first = next(model.parameters(), None)
    if first is None:
        raise ValueError("this model has no parameters: there is nothing for DDP to synchronise")
    if first.device.type == "cuda":
        index = first.device.index if first.device.index is not None else torch.cuda.current_device()
        ddp_kwargs.setdefault("device_ids", [index])
        ddp_kwargs.setdefault("output_device", index)
    else:
        ddp_kwargs.setdefault("device_ids", None)
    return nn.parallel.DistributedDataParallel(model, **ddp_kwargs)
