"""The five collectives run for real: a worker script that applies each one with ``torch.distributed`` (gloo, CPU
tensors) to the buffers of :func:`dlo.lessons.figures.collectives.before`, and :func:`run_demo`, which launches it
and prints each rank's buffer before and after, collective by collective.

Run as a script by :func:`dlo.runtime.launch` (``python -m`` is not needed: the launcher runs this file); every
rank writes one record per collective: ``{"collective", "before", "after"}``.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

from dlo.lessons.figures.collectives import COLLECTIVES, before, reference
from dlo.runtime import distributed, launch, write_record


def _apply(name: str, values: list[int], world: int) -> list[float]:
    """Collective ``name`` on this rank's ``values`` (a float32 CPU tensor), as torch.distributed does it."""
    x = torch.tensor(values, dtype=torch.float32)
    if name == "broadcast":
        dist.broadcast(x, src=0)
        return x.tolist()
    if name == "all_reduce":
        dist.all_reduce(x)  # sum by default
        return x.tolist()
    if name == "reduce_scatter":
        out = torch.zeros(len(values) // world)
        dist.reduce_scatter_tensor(out, x)
        return out.tolist()
    if name == "all_gather":
        out = torch.zeros(len(values) * world)
        dist.all_gather_into_tensor(out, x)
        return out.tolist()
    out = torch.zeros_like(x)
    dist.all_to_all_single(out, x)
    return out.tolist()


def _worker() -> None:
    with distributed(backend="gloo", device="cpu", timeout_s=120) as ctx:
        for name in COLLECTIVES:
            mine = before(name, ctx.world_size)[ctx.rank]
            write_record({"collective": name, "before": mine, "after": _apply(name, mine, ctx.world_size)})


def run_demo(nproc: int = 2, *, timeout_s: float = 300, show: bool = True) -> list[dict]:
    """Launch the worker on ``nproc`` CPU processes (gloo), print before → after per collective and rank, and
    return the records (one per rank and collective). Each "after" is also compared with the pure reference the
    figure is drawn from: a difference raises."""
    records = launch(Path(__file__), [], nproc, timeout_s=timeout_s, echo=False, env={"OMP_NUM_THREADS": "1"})
    for name in COLLECTIVES:
        rows = sorted((r for r in records if r["collective"] == name), key=lambda r: r["rank"])
        want = reference(name, before(name, nproc))
        got = [[int(v) for v in r["after"]] for r in rows]
        if got != want:
            raise AssertionError(f"{name}: torch.distributed gave {got}, the reference {want}")
        if show:
            print(f"{name}:")
            for r in rows:
                print(f"  rank {r['rank']}: {r['before']} -> {[int(v) for v in r['after']]}")
    return records


if __name__ == "__main__":
    _worker()
