"""Choosing from the trials (:func:`best_setting`) and the two cluster questions: how many workers a rank can
afford (:func:`core_budget`) and whether shared memory will hold the batches (:func:`shm_status`)."""
from __future__ import annotations

import math
import os
import shutil
from pathlib import Path
from typing import Any


from dlo import data


from dlo.lessons.loader.trial import LOADER_KNOBS, MiB

SHM_PATH = Path("/dev/shm")  # where worker processes put the batches they hand to the main process (Linux)


# --------------------------------------------------------------------------------------------------------
# Choosing
# --------------------------------------------------------------------------------------------------------

def best_setting(df, tolerance: float = 0.05):
    """The setting to keep, as ``(row, reason)``: the row of ``df`` (a pandas Series) and one sentence.

    Highest throughput wins, except that any setting within ``tolerance`` (a fraction: 0.05 = 5 %) of the
    best is as good, measured on a few batches, and then the cheapest of those is kept: fewest workers,
    then least memory (``peak_total_mib``), then smallest ``prefetch_factor``. Why: every worker is a
    process that takes a CPU core and memory (its own copy of whatever it touches). The cores are shared
    with the main training process (which launches kernels, runs the optimizer, logs) and, on a multi-GPU
    node, with the other ranks, each with its own workers; a worker that buys 2 % in an isolated test
    often costs more than that once the whole node is busy.
    """
    if not 0 <= tolerance < 1:
        raise ValueError(f"tolerance must be a fraction in [0, 1), got {tolerance!r}")
    if df is None or len(df) == 0:
        raise ValueError("best_setting needs a non-empty table of trials (rows of LoaderTrial.row())")
    if "throughput" not in df.columns:
        raise ValueError("best_setting needs a 'throughput' column: build df from LoaderTrial.row()")
    valid = df[df["throughput"].notna()]
    if len(valid) == 0:
        raise ValueError("no trial has a throughput (each needs at least 2 iterations)")
    names = dict(zip(df.index, row_labels(df)))
    best_idx = valid["throughput"].idxmax()
    best = valid.loc[best_idx]
    top = float(best["throughput"])
    close = valid[valid["throughput"] >= (1 - tolerance) * top]

    def key(item):
        idx, row = item
        mem = row.get("peak_total_mib")
        mem = float(mem) if mem is not None and not (isinstance(mem, float) and math.isnan(mem)) else math.inf
        workers = row.get("num_workers")
        prefetch = row.get("prefetch_factor")
        prefetch = 0 if prefetch is None or (isinstance(prefetch, float) and math.isnan(prefetch)) else prefetch
        return (workers if workers is not None else 0, mem, prefetch, -float(row["throughput"]))

    idx, chosen = min(close.iterrows(), key=key)
    thr = float(chosen["throughput"])

    def mem(row) -> str:
        v = row.get("peak_total_mib")
        return "" if v is None or (isinstance(v, float) and math.isnan(v)) else f", {float(v):.0f} MiB"

    if idx == best_idx:
        others = len(close) - 1
        reason = (f"{names[idx]} is the fastest ({thr:,.0f} img/s{mem(chosen)}, waiting "
                  f"{float(chosen.get('wait_fraction', math.nan)):.0%} of the time) and "
                  + (f"none of the {others} other settings within {tolerance:.0%} of it is cheaper"
                     if others else f"no other setting comes within {tolerance:.0%} of it"))
    else:
        reason = (f"{names[idx]} ({thr:,.0f} img/s{mem(chosen)}, {chosen.get('num_workers')} workers) is within "
                  f"{tolerance:.0%} of the fastest, {names[best_idx]} ({top:,.0f} img/s{mem(best)}, "
                  f"{best.get('num_workers')} workers), at a lower cost: keep it and leave the spare cores "
                  f"and memory to the training process and the other ranks")
    return chosen, reason


def core_budget(nproc_per_node: int = 1) -> dict[str, Any]:
    """How many loader workers each training process (rank) of this node can afford.

    * ``available``: cores this process may run on (its affinity mask, :func:`dlo.data.loaders.available_cores`):
      what Slurm (``--cpus-per-task``), ``taskset`` or a container actually grants, unlike ``cpu_count``,
      the machine's total.
    * ``slurm_cpus_per_task``: ``$SLURM_CPUS_PER_TASK`` if set. When it is smaller than the affinity mask
      (a cluster that does not bind tasks to cores) it is the budget: using more steals cores from jobs
      beside yours.
    * ``max_workers_per_rank = max(0, cores // nproc_per_node - 1)``: the cores are split between the
      ranks of this node, and each rank keeps one core for its own training loop (Python, kernel launches,
      optimizer step): workers beyond that compete with the process they feed.

    ``nproc_per_node``: ranks sharing *these* cores. Launched by ``srun`` with one task per GPU, each
    process has its own cores: 1. One task running ``torchrun --nproc-per-node=N``: N.
    """
    if isinstance(nproc_per_node, bool) or not isinstance(nproc_per_node, int) or nproc_per_node < 1:
        raise ValueError(f"nproc_per_node must be a positive integer, got {nproc_per_node!r}")
    available = data.available_cores()
    raw = os.environ.get("SLURM_CPUS_PER_TASK")
    try:
        slurm = int(raw) if raw else None
    except ValueError:
        slurm = None
    if slurm is not None and slurm < 1:
        slurm = None
    cores = min(available, slurm) if slurm is not None else available
    per_rank = cores // nproc_per_node
    workers = max(0, per_rank - 1)
    source = (f"SLURM_CPUS_PER_TASK={slurm}" if slurm is not None and slurm < available
              else f"{available} cores in this process's affinity mask")
    explanation = (f"{cores} cores ({source}) shared by {nproc_per_node} rank(s): {per_rank} per rank, one kept for "
                   f"the training process itself, so at most {workers} loader worker(s) per rank"
                   + ("; below 2 cores per rank, load in the main process (num_workers=0)" if workers == 0 else ""))
    return {
        "available": available,
        "slurm_cpus_per_task": slurm,
        "cpu_count": os.cpu_count(),
        "nproc_per_node": nproc_per_node,
        "cores": cores,
        "cores_per_rank": per_rank,
        "max_workers_per_rank": workers,
        "explanation": explanation,
    }


def shm_status(path: str | os.PathLike | None = None) -> dict[str, Any]:
    """Size and free space of the shared-memory filesystem (``/dev/shm``), and torch's sharing strategy.

    Worker processes do not hand batches to the main process by pickling them through a pipe: each batch's
    tensors are put in shared memory and only a handle travels. With the default strategy
    ("file_descriptor") that memory lives in ``/dev/shm``, and up to ``num_workers x prefetch_factor``
    batches are in flight at once (e.g. 8 workers x 2 x a batch of 256 images 3 x 224 x 224 in float32,
    154 MiB each, is about 2.4 GiB). Docker gives containers a 64 MiB ``/dev/shm`` by default: the loader
    then dies with ``Bus error`` or ``RuntimeError: unable to write to file </torch_...>`` (or "No space
    left on device"), often only with workers and big batches. Fixes, best first:

    * give the container more shared memory: ``docker run --shm-size=8g`` (or ``--ipc=host``); on
      Kubernetes mount an ``emptyDir`` with ``medium: Memory`` on ``/dev/shm``;
    * fewer batches in flight: fewer workers, smaller ``prefetch_factor``, smaller batches (or uint8
      images converted to float on the device);
    * ``torch.multiprocessing.set_sharing_strategy('file_system')``: shared files named in ``/dev/shm``
      kept open by name instead of file descriptors (helps with "too many open files"; can leak files if
      a process is killed, and still needs space).

    Returns ``path, exists, total_bytes, free_bytes, total_mib, free_mib`` (None when the path is missing),
    ``sharing_strategy``, ``sharing_strategies`` (all this platform has) and a one-line ``advice``.
    ``path`` defaults to :data:`SHM_PATH`.
    """
    shm = Path(path) if path is not None else SHM_PATH
    total = free = None
    exists = shm.exists()
    if exists:
        try:
            usage = shutil.disk_usage(shm)
            total, free = int(usage.total), int(usage.free)
        except OSError:
            pass
    try:
        import torch.multiprocessing as tmp

        strategy = tmp.get_sharing_strategy()
        strategies = sorted(tmp.get_all_sharing_strategies())
    except Exception:  # noqa: BLE001 - platforms without torch.multiprocessing sharing
        strategy, strategies = None, []
    if not exists:
        advice = (f"{shm} does not exist: workers' batches go through the sharing strategy's other storage; "
                  f"if workers crash, try num_workers=0 to confirm")
    elif total is None:
        advice = f"could not read the size of {shm}"
    elif total < 512 * MiB:
        advice = (f"{shm} holds only {total / MiB:.0f} MiB (a container default?): loader workers may die with "
                  f"'Bus error'; raise it (docker --shm-size / --ipc=host) or keep num_workers x prefetch_factor "
                  f"x batch bytes well below {free / MiB:.0f} MiB free")
    else:
        advice = (f"{shm}: {free / MiB:,.0f} MiB free of {total / MiB:,.0f} MiB; in-flight batches "
                  f"(num_workers x prefetch_factor x batch bytes) must fit there")
    return {
        "path": str(shm),
        "exists": exists,
        "total_bytes": total,
        "free_bytes": free,
        "total_mib": None if total is None else total / MiB,
        "free_mib": None if free is None else free / MiB,
        "sharing_strategy": strategy,
        "sharing_strategies": strategies,
        "advice": advice,
    }



def row_labels(df) -> list[str]:
    """``label`` column if present, else built from the settings that differ between rows."""
    if "label" in df.columns and df["label"].notna().all():
        return [str(v) for v in df["label"]]
    varying = [k for k in LOADER_KNOBS if k in df.columns and df[k].astype(str).nunique() > 1] or \
              [k for k in ("num_workers",) if k in df.columns]
    return [", ".join(f"{k}={row[k]}" for k in varying) or str(i) for i, (_, row) in enumerate(df.iterrows())]
