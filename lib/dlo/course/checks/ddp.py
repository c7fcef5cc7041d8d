"""Checkers of Jour2/ddp_train.py (``dlo check ddp <step>``): the script's functions against the checker's own
reference (DistributedSampler, DDP's attributes, a plain training loop, the sums over the ranks) on generated cases
(:mod:`dlo.course.checks.ddp_cases`: world sizes 1 to 4, uneven datasets, several seeds and epochs, fp32 and fp64).

Most run in this process: a "distributed" context is faked with a :class:`~dlo.runtime.distributed.DistContext` (rank,
world size) and, where DDP itself is needed, a one-process gloo group. ``reduce`` and ``checkpoint`` need real peers:
they start 3, then 2 gloo processes (:data:`WORLD_SIZES`, one launch each, every case in it), each calling the
student's function (ddp_worker.py).
"""
from __future__ import annotations

import contextlib
import json
import tempfile
from pathlib import Path
from typing import Any, Callable
from unittest import mock

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DistributedSampler, TensorDataset

from dlo.course.checks import ddp_cases
from dlo.course.checks.cases import Case, compare, run_student
from dlo.course.checks.framework import CheckFailed, expect, register, peer_records
from dlo.runtime.distributed import DistContext

SCRIPT = "Jour2/ddp_train.py"
WORKER = Path(__file__).with_name("ddp_worker.py")


def fake_context(rank: int = 0, world_size: int = 1, local_rank: int | None = None) -> DistContext:
    """A DistContext as torchrun would describe process ``rank`` of ``world_size`` (4 per node)."""
    local = rank % 4 if local_rank is None else local_rank
    return DistContext(rank=rank, local_rank=local, world_size=world_size, local_world_size=min(world_size, 4),
                       master_addr="127.0.0.1", master_port=29500, source="torchrun" if world_size > 1 else "single")


@contextlib.contextmanager
def one_process_group():
    """A gloo process group of world size 1 in this process (enough to build a DDP wrapper)."""
    if dist.is_initialized():
        yield
        return
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", store=dist.FileStore(str(Path(tmp) / "store"), 1), rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()


def _cuda(gpus: int):
    """torch.cuda seen as a node of ``gpus`` GPUs (no GPU is touched)."""
    stack = contextlib.ExitStack()
    stack.enter_context(mock.patch("torch.cuda.is_available", return_value=True))
    stack.enter_context(mock.patch("torch.cuda.device_count", return_value=gpus))
    return stack


#: Devices computed from the global rank, each right only on some layouts: what the answer did, when it did so on
#: every case tried.
_FROM_GLOBAL_RANK = (
    (lambda ctx, gpus: ctx.rank, "the global rank points past the node's last GPU on every node but the first"),
    (lambda ctx, gpus: ctx.rank % gpus, "a device computed from the global rank (rank % device_count) is right only "
                                        "when every node runs one process per GPU"),
    (lambda ctx, gpus: ctx.rank % ctx.world_size, "rank % world_size is the global rank itself, which points past "
                                                  "the node's last GPU on every node but the first"),
)


@register("ddp", "device", ("rank_device",), SCRIPT)
def _check_device(rank_device: Callable) -> str:
    cases = ddp_cases.device_cases()
    for case in cases:
        with mock.patch("torch.cuda.is_available", return_value=False):
            dev = run_student(rank_device, case, lambda fn, kw: fn(kw["ctx"]))
        expect(isinstance(dev, torch.device) and dev.type == "cpu",
               f"with {case.label} but no GPU available: return torch.device('cpu'), got {dev!r}")
    got = []
    for case in cases:
        with _cuda(case.kwargs["gpus"]):
            got.append(run_student(rank_device, case, lambda fn, kw: fn(kw["ctx"])))
    wrong = [i for i, c in enumerate(cases) if not (isinstance(got[i], torch.device) and got[i].type == "cuda"
                                                    and got[i].index == c.kwargs["ctx"].local_rank)]
    if not wrong:
        return f"cuda:local_rank on {len(cases)} layouts (1-3 nodes of 1-8 GPUs, 1 to 8 processes each); CPU otherwise"
    case, dev = cases[wrong[0]], got[wrong[0]]
    local = case.kwargs["ctx"].local_rank
    expect(isinstance(dev, torch.device) and dev.type == "cuda", f"with {case.label}: GPUs are available, return a "
                                                                 f"CUDA device, got {dev!r}")
    expect(dev.index is not None, f"with {case.label}: torch.device('cuda') has no index, so every process of the node "
                                  f"uses the current GPU (0); expected cuda:{local} (its local_rank)")
    for rule, why in _FROM_GLOBAL_RANK:
        if all(isinstance(d, torch.device) and d.index == rule(c.kwargs["ctx"], c.kwargs["gpus"])
               for c, d in zip(cases, got)):
            raise CheckFailed(f"with {case.label}: got {dev}, expected cuda:{local} (its local_rank): {why}")
    raise CheckFailed(f"with {case.label}: got {dev}, expected cuda:{local} (its local_rank)")


_DDP_ERRORS = (  # what torch says when DDP is built the wrong way, and what it means here
    ("process group has not been initialized",
     "with one process (ctx.is_distributed False) return the model unwrapped: DDP needs a process group"),
    ("device_ids", "on the CPU there is no GPU to give DDP: device_ids is only for a model on one GPU per process"),
    ("SyncBatchNorm", "keep plain BatchNorm unless sync_bn=True (and SyncBatchNorm needs GPUs)"),
)


def _explain_ddp_errors(fn: Callable) -> Callable:
    """``fn`` with torch's ValueError/RuntimeError on a wrongly built DDP turned into a CheckFailed that says why."""
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except NotImplementedError:
            raise
        except (ValueError, RuntimeError) as exc:
            for needle, why in _DDP_ERRORS:
                if needle in str(exc):
                    raise CheckFailed(f"{why} (torch said: {str(exc).splitlines()[0][:160]})") from None
            raise
    return call


def _wrap_problem(case: Case, got: dict, want: dict) -> str | None:
    """What differs between the student's wrapped model and the reference's, in one line (None: nothing)."""
    opts = case.kwargs["options"]
    if got["ddp"] != want["ddp"]:
        return ("with one process (ctx.is_distributed False) return the model, unwrapped" if not want["ddp"] else
                "with several processes wrap the model in DistributedDataParallel")
    if got["device_ids"] is not None:
        return "DDP was given device_ids for a CPU model: device_ids is only for a model on one GPU per process"
    if got["sync_bn"] != want["sync_bn"]:
        return ("sync_bn=True but the model still has plain BatchNorm layers: they must become SyncBatchNorm (before "
                "wrapping)" if want["sync_bn"] else
                "sync_bn=False, yet the BatchNorm layers became SyncBatchNorm: keep plain BatchNorm unless sync_bn=True "
                "(SyncBatchNorm costs one all-reduce per layer)")
    if got["find_unused"] != want["find_unused"]:
        asked = opts.get("find_unused_parameters", "left at its default, False")
        return (f"DDP's find_unused_parameters is {got['find_unused']} with find_unused_parameters={asked}: pass "
                "the caller's find_unused_parameters on to DDP")
    if got["bucket_bytes_cap"] != want["bucket_bytes_cap"]:
        asked = opts.get("bucket_cap_mb", "left at its default, 25.0")
        return (f"DDP's bucket cap is {got['bucket_bytes_cap']} bytes with bucket_cap_mb={asked}, expected "
                f"{want['bucket_bytes_cap']}: pass the caller's bucket_cap_mb on to DDP unchanged")
    if not got["same_weights"]:
        return "the returned model's weights are not those of the model given: wrap the model you were given"
    return None


@register("ddp", "wrap", ("wrap_model",), SCRIPT)
def _check_wrap(wrap_model: Callable) -> str:
    wrap_model = _explain_ddp_errors(wrap_model)
    cases = ddp_cases.wrap_cases()
    with one_process_group():
        for case in cases:
            k = case.kwargs
            model = ddp_cases.make_model(k["kind"], k["seed"])
            original = {n: t.detach().clone() for n, t in model.state_dict().items()}
            ctx = ddp_cases.context(0, k["world"], 4)
            wrapped = run_student(wrap_model, case,
                                  lambda fn, kw: fn(model, ctx, torch.device("cpu"), **kw["options"]))
            problem = _wrap_problem(case, ddp_cases.describe_wrapped(wrapped, original), ddp_cases.expected_wrapped(case))
            expect(problem is None, f"with {case.label}: {problem}")
    return (f"DDP when distributed, SyncBatchNorm on request, bucket_cap_mb and find_unused_parameters passed on "
            f"({len(cases)} cases)")


def _shard_orders(make_train_loader: Callable, case: Case, seed: int) -> dict[int, list[list[int]]]:
    """Per epoch, what each rank's loader yields (the sample indices, in order), after the structure is checked;
    under key ``-1 - epoch``, what each rank's sampler draws."""
    k = case.kwargs
    world, per_rank = k["world"], k["global_batch"] // k["world"]
    dataset = TensorDataset(torch.arange(k["n"]))
    loaders = []
    for rank in range(world):
        ctx = ddp_cases.context(rank, world, 4)
        loader, sampler = run_student(make_train_loader, case,
                                      lambda fn, kw: fn(dataset, ctx, kw["global_batch"], seed=seed))
        expect(isinstance(sampler, DistributedSampler),
               "return a torch.utils.data.DistributedSampler as the sampler")
        expect(sampler.num_replicas == world and sampler.rank == rank,
               f"with {case.label}: rank {rank}'s sampler has num_replicas={sampler.num_replicas}, rank={sampler.rank}; "
               "give it num_replicas=ctx.world_size and rank=ctx.rank (the process group may not exist yet)")
        expect(loader.sampler is sampler, "the loader does not draw from the sampler you return (its sampler= is "
                                          "another one): the shard is never used")
        expect(loader.batch_size == per_rank, f"with {case.label}: each of the {world} rank(s) loads global_batch / "
                                              f"world_size = {per_rank} samples per step, got {loader.batch_size}")
        loaders.append((loader, sampler))
    orders: dict[int, list[list[int]]] = {}
    for epoch in ddp_cases.EPOCHS:
        orders[epoch] = []
        for loader, sampler in loaders:
            sampler.set_epoch(epoch)
            orders[epoch].append([int(i) for (batch,) in loader for i in batch])
            orders.setdefault(-1 - epoch, []).append([int(i) for i in sampler])
    return orders


def _loaded(got: list[int], order: list[int], batch: int) -> bool:
    """The loader yields the sampler's order in batches, the last, smaller one kept or dropped."""
    return got in (order, order[:len(order) - len(order) % batch])


def _shard_problem(make_train_loader: Callable, case: Case, orders: dict) -> str | None:
    k = case.kwargs
    world, n, batch = k["world"], k["n"], k["global_batch"] // k["world"]
    for epoch in ddp_cases.EPOCHS:
        per_rank = orders[epoch]
        want = [ddp_cases.reference_order(n, world, r, k["seed"], epoch) for r in range(world)]
        if all(_loaded(g, w, batch) for g, w in zip(per_rank, want)):
            continue
        drawn = [i for got in orders[-1 - epoch] for i in got]
        if len(drawn) > n - n % world and len(set(drawn)) < len(drawn):
            return (f"with {case.label}: the samplers drew {len(drawn)} samples for {n} in the dataset, some of them "
                    "twice: the sampler padded the shards with repeated images; drop the uneven tail instead")
        seen = [i for got in per_rank for i in got]
        twice = sorted({i for i in seen if seen.count(i) > 1})
        if twice:
            return (f"with {case.label}: the ranks' shards overlap (samples {twice[:6]} are read twice in epoch {epoch}):"
                    " every rank must draw the same shuffle, from the same seed")
        unshuffled = [ddp_cases.reference_order(n, world, r, k["seed"], epoch, shuffle=False) for r in range(world)]
        if all(_loaded(g, w, batch) for g, w in zip(per_rank, unshuffled)):
            return f"with {case.label}: the samples come in the dataset's order: shuffle=True, the order should be random"
        other = _shard_orders(make_train_loader, case, k["seed"] + 1)
        if other == orders:
            return (f"with {case.label}: seeds {k['seed']} and {k['seed'] + 1} gave the same shuffle: the sampler must "
                    "use the seed argument")
        rank = next(r for r in range(world) if not _loaded(per_rank[r], want[r], batch))
        return (f"with {case.label}, epoch {epoch}: rank {rank} read {per_rank[rank][:8]}..., expected "
                f"{want[rank][:8]}... (DistributedSampler's shard, drop_last)")
    return None


@register("ddp", "shard", ("make_train_loader",), SCRIPT)
def _check_shard(make_train_loader: Callable) -> str:
    cases = ddp_cases.shard_cases()
    for case in cases:
        problem = _shard_problem(make_train_loader, case, _shard_orders(make_train_loader, case, case.kwargs["seed"]))
        expect(problem is None, problem or "")
    for world, global_batch in ddp_cases.UNEVEN:
        try:
            make_train_loader(TensorDataset(torch.arange(40)), ddp_cases.context(0, world, 4), global_batch)
        except ValueError:
            continue
        raise CheckFailed(f"a global batch of {global_batch} on {world} ranks was accepted: it does not split evenly, "
                          "so it must raise ValueError before any work (dlo.parallel.ddp.per_rank_batch does)")
    return (f"each rank's samples over {len(ddp_cases.EPOCHS)} epochs are DistributedSampler's shard ({len(cases)} cases, "
            "world sizes 1-4, uneven datasets, several seeds); per-rank batch = global / world size")


def _epoch_diagnosis(case: Case, epoch: int, sampler, calls: list[int], got: list[int], want: list[int]) -> str:
    """Why epoch ``epoch`` visited the wrong samples, from what the sampler was told and when (a cause is named only
    when the calls show it)."""
    drawn = sampler.drawn_with[-1] if sampler.drawn_with else None
    if not sampler.calls:
        return (f"with {case.label}: epoch {epoch} visited the samples in epoch 0's order: the sampler was never told "
                "the epoch, so every epoch repeats epoch 0's shuffle")
    if drawn != epoch and epoch in calls:
        return (f"with {case.label}: epoch {epoch}'s order was drawn with epoch {drawn}: set_epoch came after the "
                "loader started iterating, and the shuffle is fixed when iteration begins, so the epoch must be set "
                "before the loop")
    if calls and drawn == calls[0] != epoch:
        return (f"with {case.label}: during epoch {epoch} the sampler was told epoch {calls[0]}: the shuffle must come "
                "from this epoch's own number (the same on every rank, another one next epoch)")
    return f"with {case.label}: epoch {epoch} visited samples {got[:8]}..., expected {want[:8]}..."


def _epoch_problem(train_epoch: Callable, case: Case) -> str | None:
    """Three consecutive epochs of the student's loop and of the reference, from the same start."""
    mine = ddp_cases.epoch_setup(case)
    ref = ddp_cases.epoch_setup(case)
    dtype = case.kwargs["dtype"]
    for epoch in range(case.kwargs["start"], case.kwargs["start"] + 3):
        data, sampler = mine[0], mine[1]
        data.seen.clear()
        before = len(sampler.calls)
        out = run_student(train_epoch, case, lambda fn, kw: fn(mine[3], mine[2], sampler, epoch, mine[4], mine[5],
                                                               torch.device("cpu"), show_bar=False))
        ref[0].seen.clear()
        want = ddp_cases.reference_epoch(ref[3], ref[2], ref[1], epoch, ref[4], ref[5])
        if data.seen != ref[0].seen:
            return _epoch_diagnosis(case, epoch, sampler, sampler.calls[before:], data.seen, ref[0].seen)
        for name, a, b in zip(("weight", "bias"), (mine[3].weight, mine[3].bias), (ref[3].weight, ref[3].bias)):
            problem = compare(a.detach(), b.detach(), f"the {name} after epoch {epoch}", scale=10)
            if problem:
                return f"with {case.label}: {problem} (the same samples were visited, in the same order)"
        try:
            got = {"loss_sum": float(out[0]), "correct": int(out[1]), "count": int(out[2])}
        except (TypeError, ValueError, IndexError):
            return f"with {case.label}: train_epoch returned {out!r}; expected (loss_sum, correct, count)"
        want = dict(zip(("loss_sum", "correct", "count"), want))
        problem = compare(got, want, "the returned totals", dtype=dtype, scale=10)
        if problem:
            return f"with {case.label}, epoch {epoch}: {problem}"
    return None


@register("ddp", "epoch", ("train_epoch",), SCRIPT)
def _check_epoch(train_epoch: Callable) -> str:
    cases = ddp_cases.epoch_cases()
    for case in cases:
        problem = _epoch_problem(train_epoch, case)
        expect(problem is None, problem or "")
    return (f"over 3 consecutive epochs each epoch visits its own shuffle (set_epoch before the loop), weights and "
            f"totals equal the reference loop's ({len(cases)} cases)")


def _run_ranks(fn: Callable, nproc: int, *extra: str) -> list[dict]:
    """Each of ``nproc`` gloo processes imports the script defining ``fn`` and calls it (see ddp_worker.py)."""
    name = fn.__name__
    script = Path(fn.__code__.co_filename)  # extra: the worker's arguments after the function's name
    expect(script.suffix == ".py" and script.is_file(),
           f"{name} must be defined in a script file (ddp_train.py) so that {nproc} processes can import it")
    records = peer_records(WORKER, [str(script), name, *extra], nproc)
    errors = [r["error"] for r in records if "error" in r]
    if any(e.startswith("NotImplementedError") for e in errors):
        raise NotImplementedError(errors[0].split(":", 1)[-1].strip())
    expect(not errors, f"{name} raised on {nproc} processes: {errors[0] if errors else ''}")
    return sorted(records, key=lambda r: r["rank"])


#: The world sizes of the multi-process checks: 3 first (odd: a division by a hard-coded 2 shows), then 2.
WORLD_SIZES = (3, 2)

_REDUCE_NAMED = {
    "local": "rank {rank} returned its own shard's numbers: the sums over the ranks never reached what you return "
             "(a reduction into a copy that is not read back?)",
    "means": "rank {rank}: averaging the ranks' means is wrong when shards differ in size: the global loss is the sum of the "
             "loss sums over the sum of the counts",
    "float32": "rank {rank}: the global loss lost digits: the totals were summed in float32 (24 bits); over a real epoch's millions "
               "of images that error grows; keep the totals in float64",
    "count": "rank {rank}: the global loss is divided by the rank's own count: the counts must be summed over the ranks too",
}


def _procs(world: int) -> str:
    return f"{world} processes" if world > 1 else "one process (no process group)"


def _reduce_problem(results: list[dict], cases: list, world: int) -> str | None:
    """The first rank and case whose numbers differ from the reference, with the mistake named when every rank's
    answer on every case is that mistake's."""
    def close(got: dict, want: dict) -> bool:
        return all(compare(got.get(k), want[k], k, dtype=torch.float64) is None for k in want)

    failures = [(i, r) for i, rows in enumerate(cases) for r in range(world)
                if not close(results[r]["result"][i], ddp_cases.reduce_reference(rows))]
    if not failures:
        return None
    i, rank = failures[0]
    for name, message in _REDUCE_NAMED.items():
        if all(close(results[r]["result"][j], ddp_cases.reduce_known(rows, r)[name])
               for j, rows in enumerate(cases) for r in range(world) if (j, r) in failures):
            return f"on {_procs(world)}: " + message.format(rank=rank)
    got, want = results[rank]["result"][i], ddp_cases.reduce_reference(cases[i])
    shards = ", ".join(f"({s:g}, {c}, {n})" for s, c, n in cases[i])
    for key, what in (("loss", "the global loss (sum of loss sums / sum of counts)"),
                      ("accuracy", "the global accuracy (sum of correct / sum of counts)")):
        problem = compare(got.get(key), want[key], what, dtype=torch.float64)
        if problem:
            return f"on {_procs(world)} with (loss_sum, correct, count) = {shards} by rank: rank {rank}: {problem}"
    return None


@register("ddp", "reduce", ("reduce_metrics",), SCRIPT)
def _check_reduce(reduce_metrics: Callable) -> str:
    if not dist.is_initialized():  # one process, no process group: the local numbers are the global ones
        cases = ddp_cases.reduce_cases(1, 3)
        results = [{"result": [reduce_metrics(*(torch.tensor(v, dtype=torch.float64 if j == 0 else torch.int64)
                                                for j, v in enumerate(rows[0]))) for rows in cases]}]
        expect(all(isinstance(r, dict) for r in results[0]["result"]),
               f"return a dict with the loss and the accuracy, got {results[0]['result'][0]!r}")
        problem = _reduce_problem(results, cases, 1)
        expect(problem is None, problem or "")
    tried = 0
    for world in WORLD_SIZES:
        cases = ddp_cases.reduce_cases(world)
        results = _run_ranks(reduce_metrics, world, json.dumps(cases))
        problem = _reduce_problem(results, cases, world)
        expect(problem is None, problem or "")
        tried += len(cases)
    return (f"sums all-reduced over the ranks, then divided: the global numbers on every rank ({tried} cases on 3 and "
            "2 processes, shards of different sizes)")


@register("ddp", "checkpoint", ("save_on_main",), SCRIPT)
def _check_checkpoint(save_on_main: Callable) -> str:
    from torch.nn.parallel import DistributedDataParallel as DDP

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ckpt.pt"
        model = ddp_cases.BNNet()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        # rank 1 of 2; rank 4 of 8 is local rank 0 of the second node (4 per node): only global rank 0 writes
        for rank, world in ((1, 2), (4, 8), (2, 3)):
            out = save_on_main(fake_context(rank, world), path, model, opt, 1)
            expect(not path.exists() and out is None,
                   f"rank {rank} of {world} (local_rank {fake_context(rank, world).local_rank}) wrote the checkpoint: "
                   f"rank {rank} must not write it, only rank 0 (ctx.is_main) does")
        with one_process_group():
            wrapped = DDP(model)
            out = save_on_main(fake_context(0, 1), path, wrapped, opt, 1)
        expect(path.is_file(), "rank 0 must write the checkpoint at `path`")
        try:  # a checkpoint holds tensors and plain values: loaded safely, as the course loads every file
            state: Any = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 -- any unreadable file is the student's mistake, said in one line
            raise CheckFailed(f"the checkpoint at `path` does not load with torch.load(weights_only=True) "
                              f"({type(exc).__name__}): save tensors and plain values, e.g. with "
                              "dlo.training.checkpoint.save_checkpoint") from None
        weights = state.get("model", state) if isinstance(state, dict) else None
        expect(isinstance(weights, dict) and not any(k.startswith("module.") for k in weights),
                "save the unwrapped model (keys without 'module.'): use dlo.training.checkpoint.save_checkpoint, which unwraps DDP")
        fresh = ddp_cases.BNNet()
        fresh.load_state_dict(weights)
    # Real processes: a barrier (or a save) on some ranks only passes in one process but hangs a real run.
    for world in WORLD_SIZES:
        with tempfile.TemporaryDirectory() as tmp:
            records = _run_ranks(save_on_main, world, tmp)
            _check_barriers(records, world)
            state = torch.load(Path(tmp) / "ckpt.pt", map_location="cpu", weights_only=True)
        torch.manual_seed(world)
        want = nn.Linear(3, world).state_dict()
        got = state.get("model", state) if isinstance(state, dict) else {}
        for name, tensor in want.items():
            problem = compare(got.get(name) if isinstance(got, dict) else None, tensor, f"the saved {name}")
            expect(problem is None, f"on {world} processes (a DDP-wrapped model): {problem}: save rank 0's model")
    return ("rank 0 writes a checkpoint that loads into a plain model with the model's weights; every rank waits at "
            "the barrier, after the save (3 and 2 processes)")


def _check_barriers(records: list[dict], world: int) -> None:
    calls = [r["result"]["barriers"] for r in records]
    waited = [rank for rank, c in enumerate(calls) if c]
    expect(len(waited) == world,
           f"on {world} processes {f'only rank(s) {waited}' if waited else 'no rank'} called dist.barrier(): every "
           "rank must call it "
           "(a barrier on rank 0 only hangs; without one the other ranks may read the file before it exists)")
    expect(len({len(c) for c in calls}) == 1,
           f"on {world} processes the ranks called dist.barrier() {[len(c) for c in calls]} times: the same number on "
           "every rank, else the extra ones wait forever")
    expect(calls[0][0], "rank 0 reached the barrier before the checkpoint existed: save first, then dist.barrier()")
    expect(records[0]["result"]["returned"] is not None and all(r["result"]["returned"] is None for r in records[1:]),
           f"on {world} processes: return the path on rank 0 and None on the other ranks")
