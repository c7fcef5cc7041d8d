"""PP × TP × DP (dlo.parallel.grid_step, tp_pipeline/grid_train.py): one training step on a grid of gloo
processes equals one process running the whole model on the whole batch, and every rank's communication,
per axis, equals comm_theory.

One launch per layout, every schedule of that layout in it (starting 8 processes is the cost):

* dp=2 × pp=2 × tp=2 on 8 processes: afab, 1f1b and interleaved 1F1B (2 chunks per rank);
* dp=1 × pp=2 × tp=4 on 8 processes: the pipeline's neighbours are 4 ranks apart; blocking transfers (a send
  waits for its receiver, as NCCL's large messages do), with the TP collectives in between;
* dp=4 × pp=1 × tp=2 on 8 processes: no pipeline (no transfer at all), 4 replicas;
* dp=1 × pp=3 × tp=2 on 6 processes: an odd number of stages, 6 layers (interleaved: 6 chunks of one layer).

The single-process reference is computed here from the worker's own model and batch builders.
"""
from __future__ import annotations

import ast
import importlib.util
import json
from pathlib import Path

import pytest
import torch

import dlo  # noqa: F401
from dlo.runtime import Grid
from dlo.runtime.launch import launch_forked
from dlo.models.llama import Llama
from dlo.parallel import comm
from dlo.parallel.grid_step import (TPStage, build_grid_chunks, by_axis, comm_theory, param_count, replica_batch,
                                    why_invalid)
from dlo.parallel.pipeline import Pipe, Stage, split_model, train_step

WORKER = Path(__file__).resolve().parents[1] / "tp_pipeline" / "grid_train.py"
distributed = pytest.mark.distributed


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


W = _load(WORKER, "_dlo_test_grid_train")

# (name, nproc, worker arguments)
LAYOUTS = {
    "dp2-pp2-tp2": (8, ["--dp", "2", "--pp", "2", "--tp", "2", "--schedules", "afab", "1f1b", "interleaved",
                        "--micro-batches", "4"]),
    "dp1-pp2-tp4": (8, ["--dp", "1", "--pp", "2", "--tp", "4", "--schedules", "1f1b", "interleaved",
                        "--micro-batches", "4", "--blocking"]),
    "dp4-pp1-tp2": (8, ["--dp", "4", "--pp", "1", "--tp", "2", "--schedules", "afab", "1f1b", "--micro-batches", "2"]),
    "dp1-pp3-tp2": (6, ["--dp", "1", "--pp", "3", "--tp", "2", "--schedules", "1f1b", "interleaved", "--layers", "6",
                        "--batch", "12", "--micro-batches", "3"]),
}


@pytest.fixture(scope="module", params=list(LAYOUTS))
def layout(request, tmp_path_factory):
    nproc, extra = LAYOUTS[request.param]
    argv = [*extra, "--compare", "--dump"]
    args = W.parse_args(argv)
    records = launch_forked(WORKER, argv, nproc=nproc, records_dir=tmp_path_factory.mktemp(request.param),
                            timeout_s=600, env={"OMP_NUM_THREADS": "1"})
    by_schedule: dict[str, list[dict]] = {}
    for r in sorted(records, key=lambda r: r["rank"]):
        by_schedule.setdefault(r["schedule"], []).append(r)
    assert sorted(by_schedule) == sorted(args.schedules)
    for ranks in by_schedule.values():
        assert [r["rank"] for r in ranks] == list(range(nproc))
    return args, Grid(nproc, dp=args.dp, pp=args.pp, tp=args.tp), by_schedule, W.reference_step(args)


@distributed
def test_step_equals_one_process(layout):
    """Loss, every gathered gradient and every weight after one SGD step, on every rank, fp32."""
    args, grid, by_schedule, ref = layout
    for schedule, ranks in by_schedule.items():
        covered: dict[tuple[int, int], list[str]] = {}
        for r in ranks:
            where = f"{schedule}, rank {r['rank']} {r['coords']}"
            assert r["loss"] == pytest.approx(ref["loss"], rel=1e-5, abs=1e-5), where
            for key in ("grads", "after"):
                for name, values in r[key].items():
                    torch.testing.assert_close(torch.tensor(values), ref[key][name].reshape(-1), rtol=1e-5, atol=1e-5,
                                               msg=lambda m: f"{where}, {key} of {name}: {m}")
            covered.setdefault((r["coords"]["dp"], r["coords"]["tp"]), []).extend(r["grads"])
        # the stages of every (dp, tp) coordinate hold each parameter of the model exactly once
        for names in covered.values():
            assert sorted(names) == sorted(ref["grads"]), f"{schedule}: parameters missing or on two stages"


@distributed
def test_comm_per_axis_equals_theory(layout):
    """Every rank's collectives and transfers, by (op, phase), calls and bytes: as comm_theory predicts."""
    args, grid, by_schedule, _ = layout
    cfg = W.make_config(args)
    for schedule, ranks in by_schedule.items():
        virtual = args.virtual if schedule == "interleaved" else 1
        for r in ranks:
            measured = {(c["op"], c["phase"]): {"calls": c["calls"], "bytes": c["bytes"]} for c in r["comm"]}
            theory = comm_theory(cfg, grid, r["rank"], batch=args.batch, seq=args.seq,
                                 micro_batches=args.micro_batches, virtual=virtual)
            assert measured == theory, f"{schedule}, rank {r['rank']}: {measured} != {theory}"
            axis = by_axis(measured)
            # tensor parallelism talks inside every block, the pipeline between stages, dp once per step
            assert (axis["tp"]["calls"] > 0) == (grid.tp > 1) and (axis["pp"]["calls"] > 0) == (grid.pp > 1)
            if grid.dp > 1:  # the dp all-reduce carries exactly this rank's gradients: its parameter bytes
                assert measured[("all_reduce", "dp")] == {"calls": 1, "bytes": r["param_bytes"]}
            else:
                assert axis["dp"]["calls"] == 0
            assert r["param_bytes"] == r["param_bytes_theory"] == 4 * param_count(
                cfg, pp=grid.pp, tp=grid.tp, pp_index=r["coords"]["pp"], virtual=virtual)
            assert r["comm_matches_theory"]


@distributed
def test_schedules_keep_their_promises_on_the_grid(layout):
    """The pipeline schedule runs on every (dp, tp) coordinate: 1F1B keeps at most pp - stage micro-batches
    alive, AFAB all of them; every rank holds the chunks of its pp coordinate and exchanges with the ranks of
    its Grid pp group only (4 ranks apart when tp=4), never rank ± 1."""
    args, grid, by_schedule, _ = layout
    m = args.micro_batches
    for schedule, ranks in by_schedule.items():
        for r in ranks:
            s = r["coords"]["pp"]
            if schedule == "1f1b":
                assert r["max_in_flight"] == min(grid.pp - s, m)
                assert r["stages"] == [s]
            elif schedule == "afab":
                assert r["max_in_flight"] == m
            else:
                assert r["stages"] == [s + c * grid.pp for c in range(args.virtual)]
            # the pipeline's transfers go to the neighbouring stages' ranks of the same dp and tp coordinates
            # (interleaved: the chunks form a ring, every other rank of the pipeline is a neighbour)
            pipeline = grid.group("pp", r["rank"])
            if schedule == "interleaved":
                neighbours = set(pipeline) - {r["rank"]}
            else:
                neighbours = {pipeline[t] for t in (s - 1, s + 1) if 0 <= t < grid.pp}
            assert r["pp_peers"] == sorted(neighbours), f"{schedule}, rank {r['rank']}: {r['pp_peers']}"
        # tensor-parallel ranks of one stage hold equal shares; the last stage also the head
        assert len({r["param_bytes"] for r in ranks if r["coords"]["pp"] == 0}) == 1


# ----------------------------------------------------------------------------------------------------
# One process: the pieces
# ----------------------------------------------------------------------------------------------------
def test_tp_stage_of_one_rank_equals_the_plain_stage():
    args = W.parse_args(["--layers", "4"])
    model = Llama(W.make_config(args), seed=0)
    ids, labels = W.make_batch(args)
    plain = split_model(model, 2)
    mine = build_grid_chunks(Llama(W.make_config(args), seed=0), 0, 2) + build_grid_chunks(
        Llama(W.make_config(args), seed=0), 1, 2)
    assert all(isinstance(c, TPStage) and isinstance(c, Stage) for c in mine)
    assert [c.layer_ids for c in mine] == [s.layer_ids for s in plain]
    assert [n for c in mine for n, _ in c.named_parameters()] == [n for s in plain for n, _ in s.named_parameters()]
    x, y = ids, ids
    for a, b in zip(mine, plain):
        x, y = a(x), b(y)
    torch.testing.assert_close(x, y, rtol=0, atol=0)
    torch.testing.assert_close(mine[-1].loss(x, labels), plain[-1].loss(y, labels), rtol=1e-6, atol=1e-6)


def test_one_process_step_and_theory():
    """dp = pp = tp = 1: the grid step is the plain step, nothing is communicated, the theory says so."""
    args = W.parse_args(["--micro-batches", "2"])
    cfg = W.make_config(args)
    chunks = build_grid_chunks(Llama(cfg, seed=0), 0, 1)
    comm.COUNTER.reset()
    stats = train_step(Pipe(chunks[0], W.make_batch(args), 2), "1f1b")
    assert comm.COUNTER.summary() == {} == comm_theory(cfg, Grid(1), 0, batch=args.batch, seq=args.seq,
                                                       micro_batches=2)
    assert stats.loss == pytest.approx(W.reference_step(args)["loss"], rel=1e-6)
    assert param_count(cfg) == sum(p.numel() for p in Llama(cfg, seed=0).parameters())


def test_param_count_and_theory_by_hand():
    args = W.parse_args([])
    cfg = W.make_config(args)
    total = sum(p.numel() for p in Llama(cfg, seed=0).parameters())
    norms = 2 * cfg.hidden_size * cfg.num_layers + cfg.hidden_size  # whole on every tp rank
    for pp, tp, v in ((2, 1, 1), (2, 2, 1), (2, 4, 2), (4, 2, 1)):
        held = sum(param_count(cfg, pp=pp, tp=tp, pp_index=s, virtual=v) for s in range(pp))
        assert held == (total - norms) // tp + norms
    # dp=2 pp=2 tp=2, rank 2 (dp 0, pp 1, tp 0), 4 micro-batches of 2 x 8 tokens, 2 layers on the last stage
    grid, act = Grid(8, dp=2, pp=2, tp=2), 2 * 8 * 32 * 4
    theory = comm_theory(cfg, grid, 2, batch=16, seq=8, micro_batches=4)
    assert theory[("all_reduce", "forward")] == {"calls": 4 * 5, "bytes": 4 * (4 * act + 2 * 2 * 8 * 4)}
    assert theory[("all_reduce_max", "forward")] == {"calls": 4, "bytes": 4 * 2 * 8 * 4}
    assert theory[("all_reduce", "backward")] == {"calls": 4 * 5, "bytes": 4 * 5 * act}
    assert theory[("send", "pp")] == theory[("recv", "pp")] == {"calls": 4, "bytes": 4 * act}
    assert theory[("all_reduce", "dp")]["calls"] == 1


def test_layouts_are_refused_in_one_line_before_launch():
    cfg = W.make_config(W.parse_args([]))
    ok = dict(world_size=8, dp=2, pp=2, tp=2, batch=16, micro_batches=4)
    assert why_invalid(cfg, **ok) is None
    assert "world size" in why_invalid(cfg, **{**ok, "world_size": 6})
    assert "tp=8 does not divide" in why_invalid(cfg, **{**ok, "dp": 1, "tp": 8, "pp": 1})
    assert "every stage needs at least one layer" in why_invalid(cfg, **{**ok, "dp": 1, "pp": 8, "tp": 1})
    assert "micro-batches" in why_invalid(cfg, **{**ok, "micro_batches": 3})
    assert "multiple of 2" in why_invalid(cfg, **{**ok, "micro_batches": 1, "schedule": "interleaved", "virtual": 2})
    assert "unknown schedule" in why_invalid(cfg, **{**ok, "schedule": "zigzag"})
    for reason in filter(None, (why_invalid(cfg, **{**ok, "world_size": 6}), why_invalid(cfg, **{**ok, "tp": 3}))):
        assert "\n" not in reason
    ids, labels = W.make_batch(W.parse_args([]))
    assert torch.equal(torch.cat([replica_batch((ids, labels), 4, d)[0] for d in range(4)]), ids)



def _profile(name: str) -> dict:
    """A profile of grid.ipynb, read from its PROFILES cell (all but nproc, the GPU count)."""
    nb = json.loads((WORKER.parent / "grid.ipynb").read_text())
    for cell in nb["cells"]:
        src = "".join(cell["source"])
        if cell["cell_type"] == "code" and "PROFILES = {" in src:
            for node in ast.walk(ast.parse(src)):
                if isinstance(node, ast.Dict) and any(getattr(k, "value", None) == name for k in node.keys):
                    call = node.values[[k.value for k in node.keys].index(name)]
                    return {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords if kw.arg != "nproc"}
    raise AssertionError(f"no PROFILES cell with a {name!r} profile in grid.ipynb")


@pytest.mark.parametrize("name, world", [("smoke", 8), ("full", 8), ("full", 4)])
def test_notebook_layouts_are_checked_before_launch(name, world):
    """Every layout of the notebook's profiles runs on 8 processes (the smoke profile's CPU processes, the full
    profile's 8 GPUs) and is refused in one line elsewhere, with the worker's own argument parser and checks."""
    S = _profile(name)
    argv = [str(a) for a in ("--layers", S["layers"], "--hidden", S["hidden"], "--heads", S["heads"], "--kv-heads",
                             S["kv_heads"], "--intermediate", S["intermediate"], "--vocab", S["vocab"], "--seq",
                             S["seq"], "--batch", S["batch"], "--micro-batches", S["micro_batches"])]
    cfg = W.make_config(W.parse_args(argv))
    assert len(S["layouts"]) >= 2
    for layout in S["layouts"]:
        reason = why_invalid(cfg, world_size=world, batch=S["batch"], micro_batches=S["micro_batches"], **layout)
        if world == 8:
            assert reason is None, f"{layout}: {reason}"
        else:
            assert reason and "\n" not in reason and f"the world size is {world}" in reason
