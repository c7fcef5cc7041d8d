"""The core of :mod:`dlo.lessons.apis` (which re-exports it): which libraries and strategies can run here,
Accelerate's YAML config, the per-rank measurements and the tables that compare the runs."""
from __future__ import annotations

import ast
import importlib.util
import inspect
import json
import os
import statistics
import textwrap
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch
from torch import nn

from dlo.runtime.device import synchronize
from dlo.models.config import TINY_LLAMA, TransformerConfig
from dlo.measure.bench import Measurement

#: The models of the lesson: ``"smoke"`` (2 layers, ~0.1 M parameters, the shapes of ``dlo.parallel.fsdp``'s smoke
#: Llama: a few CPU steps per second on 2 gloo processes) and ``"tiny"`` (``TINY_LLAMA``, 8 layers, ~30 M, for GPUs).
MODELS: dict[str, TransformerConfig] = {
    "smoke": TransformerConfig(vocab_size=256, hidden_size=64, intermediate_size=172, num_layers=2, num_heads=4,
                               num_kv_heads=2, tie_embeddings=True, name="smoke Llama"),
    "tiny": TINY_LLAMA,
}

#: The strategies each API offers in this lesson.
API_STRATEGIES: dict[str, tuple[str, ...]] = {"native": ("fsdp", "ddp"), "accelerate": ("fsdp", "ddp", "deepspeed"),
                                              "fabric": ("fsdp", "ddp")}
#: The module each API needs (None: torch alone).
LIBRARIES: dict[str, str | None] = {"native": None, "accelerate": "accelerate", "fabric": "lightning_fabric"}
#: The pins of requirements.txt, for the install hint.
PINS = {"accelerate": "accelerate==1.15.0", "lightning_fabric": "lightning-fabric==2.6.6", "torchao": "torchao==0.18.0",
        "deepspeed": "deepspeed==0.19.8"}


# --------------------------------------------------------------------------------------------------
# What can run here
# --------------------------------------------------------------------------------------------------

def missing_library(module: str | None) -> str | None:
    """One line saying that ``module`` is not installed (and how to install it), or None when it is."""
    if module is None or importlib.util.find_spec(module) is not None:
        return None
    pin = PINS.get(module, module)
    return f"{module} is not installed in this environment: pip install {pin} (pinned in requirements.txt)"


def _check_api(api: str, strategy: str) -> None:
    if api not in API_STRATEGIES:
        raise ValueError(f"unknown API {api!r}: choose one of {', '.join(API_STRATEGIES)}")
    if strategy not in API_STRATEGIES[api]:
        raise ValueError(f"{api} has no strategy {strategy!r} here: choose one of {', '.join(API_STRATEGIES[api])}")


def unavailable_reason(api: str, strategy: str, device_type: str) -> str | None:
    """Why ``api`` with ``strategy`` cannot run on ``device_type`` ("cpu" or "cuda"), in one line; None when it can.

    Accelerate's DeepSpeed plugin needs GPUs: on a CPU, accelerate 1.15 gives every rank a state of one
    process (``num_processes`` 1, process index 0), so DeepSpeed's batch-size check fails and the data would
    not be split. (Accelerate's FSDP plugin, on the contrary, *runs* on a CPU: as plain DDP, see the
    notebook; the run records what it resolved to.)"""
    _check_api(api, strategy)
    needed = [LIBRARIES[api]] + (["deepspeed"] if strategy == "deepspeed" else [])
    for module in needed:
        reason = missing_library(module)
        if reason:
            return f"{api} ({strategy}): {reason}"
    if api == "accelerate" and strategy == "deepspeed" and device_type != "cuda":
        return ("accelerate (deepspeed): Accelerate's DeepSpeed plugin needs GPUs (on a CPU every rank resolves to a "
                "single process, so DeepSpeed's batch check fails): run it on GPUs")
    return None


# --------------------------------------------------------------------------------------------------
# Accelerate: the YAML config and its launcher
# --------------------------------------------------------------------------------------------------

def accelerate_config(strategy: str, nproc: int, *, cpu: bool, layer_cls: str = "DecoderBlock",
                      zero_stage: int = 3, mixed_precision: str = "no") -> dict[str, Any]:
    """The config ``accelerate config`` would write for ``strategy`` on ``nproc`` processes of one machine.

    * ``"fsdp"``: ``distributed_type: FSDP`` with FSDP2 (``fsdp_version: 2``), each ``layer_cls`` module
      its own unit (``TRANSFORMER_BASED_WRAP``), resharded after forward;
    * ``"ddp"``: ``distributed_type: MULTI_GPU`` (Accelerate's name for DDP, on GPUs *or*, with
      ``use_cpu``, on CPUs: its ``MULTI_CPU`` type would start one process without MPI);
    * ``"deepspeed"``: ``distributed_type: DEEPSPEED``, ZeRO stage ``zero_stage`` (2 or 3), nothing offloaded.

    ``main_process_port: 0``: the ranks meet on a free port Accelerate picks, not on the 29500 that every
    other launch on the node defaults to.

    ``cpu``: ``use_cpu: true`` (the training script must also pass ``Accelerator(cpu=True)``: a launch
    through torchrun, which FSDP and MULTI_GPU use, does not hand it on)."""
    if strategy not in API_STRATEGIES["accelerate"]:
        raise ValueError(f"unknown Accelerate strategy {strategy!r}: choose one of {', '.join(API_STRATEGIES['accelerate'])}")
    if not isinstance(nproc, int) or isinstance(nproc, bool) or nproc < 2:
        raise ValueError(f"nproc must be an integer >= 2 (a distributed run), got {nproc!r}")
    if mixed_precision not in ("no", "bf16", "fp16"):
        raise ValueError(f"mixed_precision must be 'no', 'bf16' or 'fp16', got {mixed_precision!r}")
    cfg: dict[str, Any] = {"compute_environment": "LOCAL_MACHINE", "num_machines": 1, "machine_rank": 0,
                           "num_processes": nproc, "mixed_precision": mixed_precision, "use_cpu": bool(cpu),
                           "main_training_function": "main", "rdzv_backend": "static", "same_network": True,
                           # 0: Accelerate takes a free port. Its default, 29500, is torchrun's and every other
                           # job's on a shared node; it checks that port before using it, a race two launches can lose
                           "main_process_port": 0}
    if strategy == "fsdp":
        cfg["distributed_type"] = "FSDP"
        cfg["fsdp_config"] = {"fsdp_version": 2, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                              "fsdp_transformer_layer_cls_to_wrap": layer_cls, "fsdp_reshard_after_forward": True,
                              "fsdp_offload_params": False, "fsdp_state_dict_type": "SHARDED_STATE_DICT",
                              "fsdp_cpu_ram_efficient_loading": False, "fsdp_activation_checkpointing": False}
    elif strategy == "ddp":
        cfg["distributed_type"] = "MULTI_GPU"
    else:
        if zero_stage not in (2, 3):
            raise ValueError(f"zero_stage must be 2 or 3, got {zero_stage!r}")
        cfg["distributed_type"] = "DEEPSPEED"
        cfg["deepspeed_config"] = {"zero_stage": zero_stage, "gradient_accumulation_steps": 1,
                                   "offload_optimizer_device": "none", "offload_param_device": "none",
                                   "zero3_init_flag": False}
    return cfg


def write_accelerate_config(path: str | os.PathLike, strategy: str, nproc: int, **kwargs: Any) -> Path:
    """Write :func:`accelerate_config` as YAML to ``path`` (what ``accelerate launch --config_file`` reads)."""
    import yaml

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(accelerate_config(strategy, nproc, **kwargs), sort_keys=False))
    return path


def read_accelerate_config(path: str | os.PathLike):
    """The config as Accelerate itself reads it (``ClusterConfig``): raises if Accelerate rejects the file."""
    reason = missing_library("accelerate")
    if reason:
        raise ModuleNotFoundError(reason)
    from accelerate.commands.config.config_args import load_config_from_file

    return load_config_from_file(str(path))


# --------------------------------------------------------------------------------------------------
# Per-rank measurements
# --------------------------------------------------------------------------------------------------

def _local(t: torch.Tensor) -> torch.Tensor:
    """The part of ``t`` this rank holds: a DTensor's local shard, a ZeRO-3 parameter's partition."""
    if hasattr(t, "to_local"):
        return t.to_local()
    if hasattr(t, "ds_tensor"):  # DeepSpeed ZeRO-3: the parameter is an empty placeholder, ds_tensor the shard
        return t.ds_tensor
    return t


def _unique_bytes(tensors: Iterable[torch.Tensor], seen: set) -> int:
    total = 0
    for t in tensors:
        if t is None:
            continue
        local = _local(t)
        if local.numel() == 0:
            continue
        key = (local.untyped_storage().data_ptr(), local.storage_offset(), local.numel(), local.dtype)
        if key in seen:
            continue
        seen.add(key)
        total += local.numel() * local.element_size()
    return total


def held_bytes(model: nn.Module, optimizer: Any) -> dict[str, int]:
    """Bytes this rank holds for the model's parameters, their gradients and the optimizer's state, counted
    from the tensors themselves (a sharded tensor counts its local shard; a tensor shared by two names once).

    Call it after ``optimizer.step()`` and before ``zero_grad()`` (the gradients still exist). Works through
    the wrappers of the APIs (DDP, FSDP2, Accelerate's and Fabric's) since it only walks ``parameters()``
    and ``optimizer.state``."""
    seen: set = set()
    params = list(model.parameters())
    param_bytes = _unique_bytes(params, seen)
    grad_bytes = _unique_bytes((p.grad for p in params), seen)
    inner = getattr(optimizer, "optimizer", optimizer)  # Accelerate's and Fabric's optimizer wrappers
    states = [v for state in getattr(inner, "state", {}).values() for v in state.values()
              if isinstance(v, torch.Tensor) and v.dim() > 0]  # Adam's step counter is a 0-d tensor
    return {"params": param_bytes, "grads": grad_bytes, "optimizer": _unique_bytes(states, seen)}


class StepMeter:
    """Called once per optimizer step (``meter.step(loss, model, optimizer)``, after ``optimizer.step()``): keeps
    the loss, the time between consecutive calls (one whole step: data, forward, backward, update;
    synchronised on a GPU) and, at the first call, :func:`held_bytes`.

    :meth:`record` gives this rank's record: ``losses``, ``step_times_s``, ``timing`` (a
    ``dlo.measure.bench.Measurement`` record of the steps after ``warmup``, in tokens/s), ``held_bytes``, and
    the peak memory (``torch.cuda.max_memory_allocated`` on a GPU; on a CPU the bytes counted from the
    tensors, parameters + gradients + optimizer state)."""

    def __init__(self, device: torch.device | str, *, tokens_per_step: int, warmup: int = 1,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.device = torch.device(device)
        self.tokens_per_step, self.warmup, self.clock = tokens_per_step, warmup, clock
        self.losses: list[float] = []
        self.marks: list[float] = []
        self.bytes: dict[str, int] | None = None
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def start(self) -> None:
        """Mark the start of the first step (else the first interval starts at the first call)."""
        synchronize(self.device)
        self.marks.append(self.clock())

    def step(self, loss: torch.Tensor, model: nn.Module | None = None, optimizer: Any = None) -> None:
        self.losses.append(float(loss.detach().float().item()))  # .item() waits for the step's work
        synchronize(self.device)
        self.marks.append(self.clock())
        if self.bytes is None and model is not None:
            self.bytes = held_bytes(model, optimizer)

    @property
    def step_times_s(self) -> list[float]:
        return [b - a for a, b in zip(self.marks, self.marks[1:])]

    def measurement(self, name: str) -> Measurement:
        times = self.step_times_s
        timed = times[self.warmup:] or times
        if not timed:
            raise ValueError("no step was timed: run at least two steps (or call start() before the first)")
        return Measurement(name=name, times_s=timed, items_per_call=self.tokens_per_step, unit="tokens/s",
                           device=str(self.device), warmup=len(times) - len(timed),
                           warmup_times_s=times[:len(times) - len(timed)])

    def record(self, name: str) -> dict[str, Any]:
        held = self.bytes or {"params": 0, "grads": 0, "optimizer": 0}
        if self.device.type == "cuda":
            peak, kind = int(torch.cuda.max_memory_allocated(self.device)), "cuda_max_allocated"
        else:
            peak, kind = sum(held.values()), "tensors_counted"
        return {"losses": self.losses, "step_times_s": self.step_times_s, "timing": self.measurement(name).to_record(),
                "held_bytes": held, "peak_memory_bytes": peak, "memory_kind": kind}


# --------------------------------------------------------------------------------------------------
# Comparing the runs
# --------------------------------------------------------------------------------------------------

def rank_mean_losses(records: Sequence[Mapping[str, Any]]) -> list[float]:
    """The loss of each step averaged over the ranks of one run: the loss of the global batch (every rank
    sees the same number of sequences), whatever order each API deals the sequences to the ranks in."""
    if not records:
        raise ValueError("no records: the run wrote nothing")
    n = {len(r["losses"]) for r in records}
    if len(n) != 1:
        raise ValueError(f"the ranks ran different numbers of steps: {sorted(n)}")
    return [statistics.fmean(r["losses"][i] for r in records) for i in range(n.pop())]


def max_relative_gap(losses: Sequence[float], reference: Sequence[float]) -> float:
    """max over steps of ``|loss - reference| / |reference|``."""
    if len(losses) != len(reference):
        raise ValueError(f"{len(losses)} losses against {len(reference)} reference losses")
    return max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, reference))


def _slowest_rank_times(records: Sequence[Mapping[str, Any]], warmup: int) -> list[float]:
    """Per step, the slowest rank's time (the step ends for everyone when the slowest rank is done)."""
    per_step = list(zip(*(r["step_times_s"] for r in records)))
    times = [max(step) for step in per_step]
    return times[warmup:] or times


def runs_table(runs: Mapping[str, Sequence[Mapping[str, Any]]], reference: str) -> list[dict[str, Any]]:
    """One row per run (``{name: its ranks' records}``): what each API resolved, the step time of the slowest
    rank (median and interquartile range, after the warm-up), the bytes held per rank, and the largest
    relative gap of its rank-averaged losses to those of ``reference``. Also returns the ``timing``
    record of each run (a Measurement record, for ``dlo.measure.conclude``)."""
    if reference not in runs:
        raise ValueError(f"reference run {reference!r} is not among {sorted(runs)}")
    ref_losses = rank_mean_losses(runs[reference])
    rows = []
    for name, records in runs.items():
        records = sorted(records, key=lambda r: r["rank"])
        first = records[0]
        warmup = first["timing"]["warmup"]
        m = Measurement(name=name, times_s=_slowest_rank_times(records, warmup),
                        items_per_call=first["timing"]["items_per_call"], unit="tokens/s",
                        device=first["timing"]["device"], warmup=warmup)
        losses = rank_mean_losses(records)
        rows.append({"run": name, "api": first["api"], "strategy": first["strategy"],
                     "resolved": first["resolved"].get("summary", ""),
                     "step_ms": m.median_s * 1e3, "step_q25_ms": m.q25_s * 1e3, "step_q75_ms": m.q75_s * 1e3,
                     "param_bytes_per_rank": max(r["held_bytes"]["params"] for r in records),
                     "grad_bytes_per_rank": max(r["held_bytes"]["grads"] for r in records),
                     "optimizer_bytes_per_rank": max(r["held_bytes"]["optimizer"] for r in records),
                     "peak_memory_bytes": max(r["peak_memory_bytes"] for r in records),
                     "memory_kind": first["memory_kind"], "first_loss": losses[0], "last_loss": losses[-1],
                     "max_rel_loss_gap": max_relative_gap(losses, ref_losses), "timing": m.to_record()})
    return rows


def code_lines(fn: Callable, *, skip: Sequence[str] = ("meter",)) -> int:
    """Lines of code of ``fn``'s body: without its signature, docstring, blank lines and comments, and without
    the lines that mention a name in ``skip`` (the measuring calls every version has, not the API's code)."""
    source = textwrap.dedent(inspect.getsource(fn))
    tree = ast.parse(source)
    func = tree.body[0]
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        raise ValueError(f"{fn!r} is not a function")
    body = func.body
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    if not body:
        return 0
    lines = source.splitlines()[body[0].lineno - 1:func.end_lineno]
    count = 0
    for line in lines:
        text = line.strip()
        if not text or text.startswith("#") or any(word in text for word in skip):
            continue
        count += 1
    return count


def resolved_config(api: str, strategy: str, model: nn.Module, handle: Any = None) -> dict[str, Any]:
    """What the API actually set up, read from the objects it returned (not from what was asked):
    the wrapper class, whether the parameters are sharded, and for Accelerate its ``distributed_type`` and
    process count, for Fabric its strategy class. ``summary`` says it in a few words."""
    params = list(model.parameters())
    sharded = any(hasattr(p, "to_local") or hasattr(p, "ds_tensor") for p in params)
    inner = getattr(model, "module", model)  # Fabric's and DDP's wrappers keep the model in .module
    out: dict[str, Any] = {"api": api, "asked": strategy, "wrapper": type(model).__name__,
                           "inner": type(inner).__name__, "sharded": sharded}
    if api == "accelerate" and handle is not None:
        dtype = getattr(handle.distributed_type, "value", str(handle.distributed_type))
        plugin = getattr(handle.state, "fsdp_plugin", None) if dtype == "FSDP" else None
        out.update(distributed_type=dtype, num_processes=handle.num_processes,
                   fsdp_version=getattr(plugin, "fsdp_version", None))
        kind = f"{dtype}" + (f" v{out['fsdp_version']}" if out["fsdp_version"] else "")
    elif api == "fabric" and handle is not None:
        out.update(strategy=type(handle.strategy).__name__, world_size=handle.world_size)
        kind = out["strategy"]
    else:
        kind = "fully_shard" if sharded else type(model).__name__
    ddp_like = "DistributedDataParallel" in (out["wrapper"], out["inner"])
    out["summary"] = f"{kind}: " + ("sharded (FSDP)" if sharded else "DDP, full copy per rank" if ddp_like
                                     else "full copy per rank")
    return out


def dump(record: Mapping[str, Any]) -> str:
    """A record as one JSON line (for printing a resolved config)."""
    return json.dumps(record, default=str)


def runs_plot(table: Any, path: str | Path | None = None) -> Any:
    """Each run's step time (median, interquartile range) and the parameter bytes each rank holds, from
    :func:`runs_table`'s rows as a DataFrame indexed by run."""
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.2))
    y = range(len(table))
    ax1.barh(y, table["step_ms"], xerr=[table["step_ms"] - table["step_q25_ms"],
                                         table["step_q75_ms"] - table["step_ms"]], color="tab:blue", alpha=0.7)
    ax1.set(yticks=list(y), yticklabels=table.index, xlabel="ms per step (median, IQR)", title="step time")
    ax2.barh(y, table["param_bytes_per_rank"] / 1e3, color="tab:green", alpha=0.7)
    ax2.set(yticks=list(y), yticklabels=[""] * len(table), xlabel="kB of parameters per rank",
            title="parameters held")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig
