"""Worker started by the ``fsdp/dcp`` checker: 2 or 3 gloo processes import the student's script, shard the same
small Llama-shaped model (:mod:`dlo.course.checks.fsdp_cases`, FSDP2, one shard per rank, widths 3 ranks do not
divide), train one step on different data, save with ``save_checkpoint`` and load into a differently initialised
copy with ``load_checkpoint``; every rank's shard of every weight and of every optimizer state (both AdamW moments
and the step count) must come back as saved.

Usage (through dlo.course.checks.framework.peer_records): ``fsdp_worker.py SCRIPT FOLDER``. ``dcp.save`` and
``dcp.load`` are collective: a rank that calls one while its peer does not would wait for it until the
process group's timeout. So both are wrapped: before the real call, each rank says in a file store (no
collective, nothing to pair wrongly) that it got there, and waits a little for every peer either to get there
too or to leave the student's function without it; a missing peer is reported at once instead of hanging.
Each rank writes one record ``{"saves": n, "loads": n, "problems": [...], "error": "..."}``.
"""
import dataclasses
import datetime
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

import dlo  # noqa: F401
from dlo.course.checks import fsdp_cases as cases
from dlo.course.exercises import load_exercises
from dlo.parallel import fsdp
from dlo.runtime.distributed import init_distributed, teardown
from dlo.runtime.records import write_record

WAIT_S = 60.0  # how long a rank in dcp.save / dcp.load waits for its peers to get there (or to leave)

script, folder = sys.argv[1], Path(sys.argv[2])
ctx = init_distributed(backend="gloo", device="cpu", timeout_s=120)
store = dist.FileStore(str(folder / "sync"), ctx.world_size)
calls = {"save": 0, "load": 0}
problems: list[str] = []


class Alone(RuntimeError):
    pass


def _status(phase: str, rank: int) -> str | None:
    key = f"{phase}/{rank}"
    return store.get(key).decode() if store.check([key]) else None


def collective(name: str, real):
    """``real`` (dcp.save or dcp.load), called only once every rank has reached it."""
    def call(*args, **kwargs):
        calls[name] += 1
        store.set(f"{name}/{ctx.rank}", "entered")
        deadline = time.monotonic() + WAIT_S
        while True:
            states = {r: _status(name, r) for r in range(ctx.world_size)}
            if any(s == "failed" for s in states.values()):
                raise Alone("(another rank failed)")
            left = [r for r, s in states.items() if s == "left"]
            if left:
                raise Alone(f"dcp.{name} ran on rank {ctx.rank} but rank(s) {left} left "
                            f"{name}_checkpoint without calling it")
            if all(s == "entered" for s in states.values()):
                break
            if time.monotonic() > deadline:
                missing = [r for r, s in states.items() if s is None]
                raise Alone(f"dcp.{name} ran on rank {ctx.rank}, rank(s) {missing} never called it")
            time.sleep(0.05)
        return real(*args, **kwargs)
    return call


def student(name: str, fn, *args):
    """Call the student's ``{name}_checkpoint``; tell the peers when this rank leaves it without dcp.{name}."""
    try:
        return fn(*args)
    finally:
        if not store.check([f"{name}/{ctx.rank}"]):
            store.set(f"{name}/{ctx.rank}", "left")


def wait_all(phase: str) -> None:
    """Every rank has finished ``phase`` (file store only: a rank that failed must not leave a peer hanging in
    a collective)."""
    store.set(f"done-{phase}/{ctx.rank}", "1")
    store.wait([f"done-{phase}/{r}" for r in range(ctx.world_size)], datetime.timedelta(seconds=300))


dcp.save = collective("save", dcp.save)  # before the script is loaded: `from ... import save` gets the wrapper
dcp.load = collective("load", dcp.load)


def local(t):
    return t.to_local() if hasattr(t, "to_local") else t


error = None
try:
    ns = load_exercises(script)
    save_checkpoint, load_checkpoint = ns["save_checkpoint"], ns["load_checkpoint"]
    shape = cases.Shape(22, 2, vocab=35, tie=False, seed=0)
    model = fsdp.apply_fsdp(cases.TinyLM(shape))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(2):
        cases.loss_of(model, cases.batch(shape, ctx.rank, step)).backward()
        opt.step()
    ckpt = folder / "ckpt"
    student("save", save_checkpoint, ckpt, model, opt, 7)
    wait_all("save")
    if ctx.rank == 0 and ckpt.is_dir():
        meta = dcp.FileSystemReader(str(ckpt)).read_metadata()
        for key, item in meta.state_dict_metadata.items():
            size, chunks = getattr(item, "size", None), getattr(item, "chunks", None)
            if size is not None and len(size) >= 1 and size[0] >= ctx.world_size and len(chunks) < ctx.world_size:
                problems.append(f"the checkpoint holds {key} as one whole tensor: save the sharded state dicts "
                                "(get_state_dict(model, optimizer), not full_state_dict) so that each rank writes "
                                "only its own shard")
                break
    other = fsdp.apply_fsdp(cases.TinyLM(dataclasses.replace(shape, seed=5)))
    other_opt = torch.optim.AdamW(other.parameters(), lr=1e-3)
    step = student("load", load_checkpoint, ckpt, other, other_opt)
    wait_all("load")
    if step != 7:
        problems.append(f"load_checkpoint returned {step!r} on rank {ctx.rank}, not the saved step (7)")
    for (k, a), (_, b) in zip(model.state_dict().items(), other.state_dict().items()):
        if not torch.equal(local(a), local(b)):
            problems.append(f"rank {ctx.rank}'s shard of {k} differs after loading")
            break
    sa, sb = opt.state_dict()["state"], other_opt.state_dict()["state"]
    lost = [(i, key) for i in sa for key in sa[i]
            if i not in sb or key not in sb[i] or not torch.equal(local(sa[i][key]), local(sb[i][key]))]
    if lost:
        problems.append(f"rank {ctx.rank}'s shard of the optimizer state was not restored ({lost[0][1]} of "
                        f"parameter {lost[0][0]}, {len(lost)} entries in all)")
except Exception as exc:  # noqa: BLE001 - reported to the checker
    error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    for phase in ("save", "load"):  # peers waiting for this rank stop waiting
        if not store.check([f"{phase}/{ctx.rank}"]):
            store.set(f"{phase}/{ctx.rank}", "failed")
        store.set(f"done-{phase}/{ctx.rank}", "1")
write_record({"saves": calls["save"], "loads": calls["load"], "problems": problems, "error": error})
teardown()
