"""dlo.parallel.pipeline: stage split, schedules and their promises, on 2 and 4 real gloo processes.

One launch per world size runs every schedule (naive, AFAB, 1F1B and interleaved 1F1B, the last three also
with blocking transfers, and torch.distributed.pipelining's GPipe / 1F1B) and records each rank's
gradients and the weights after one SGD step; the single-process reference is computed here from the
same model and batch (imported from the worker). Blocking transfers make gloo behave like NCCL with
large messages (a send waits for its receiver): a schedule whose transfers could cross hangs there.

The full profile of tp_pipeline/pipeline_train.py is planned here, without GPUs, for 1 to 8 stages.
"""
from __future__ import annotations

import ast
import importlib.util
import json
from pathlib import Path

import pytest
import torch

import dlo  # noqa: F401
from dlo.runtime.launch import launch_forked
from dlo.models.llama import Llama
from dlo.parallel.p2p_replay import replay_schedule
from dlo.parallel.pipeline import (Event, Pipe, bubble_fraction, bubble_theory, build_stage, check_world_size,
                                   interleaved_actions, micro_batch_size, one_f_one_b_actions, split_layers,
                                   split_model, train_step)

SCRIPTS = Path(__file__).parent / "scripts"
WORKSHOP = Path(__file__).resolve().parents[1] / "tp_pipeline"
distributed = pytest.mark.distributed


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


W = _load(SCRIPTS / "pipeline_cases.py", "_dlo_test_pipeline_cases")
OURS = W.OURS
TORCH = ("torch_gpipe", "torch_1f1b")


@pytest.fixture(scope="module")
def reference():
    """Loss, gradients and SGD-updated weights of the whole model in one process, on the whole batch."""
    model = W.make_model()
    ids, labels = W.make_batch()
    loss = model.loss(ids, labels)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    torch.optim.SGD(model.parameters(), lr=W.LR).step()
    after = {n: p.detach().clone() for n, p in model.named_parameters()}
    return {"loss": loss.item(), "grads": grads, "after": after, "names": set(grads)}


@pytest.fixture(scope="module", params=[2, 4], ids=["2procs", "4procs"])
def runs(request, tmp_path_factory):
    nproc = request.param
    records = launch_forked(SCRIPTS / "pipeline_cases.py", nproc=nproc, records_dir=tmp_path_factory.mktemp(f"pp{nproc}"),
                     timeout_s=240, env={"OMP_NUM_THREADS": "1"})
    out: dict[str, list[dict]] = {}
    for r in records:
        out.setdefault(r["case"], []).append(r)
    assert all([r["rank"] for r in rs] == list(range(nproc)) for rs in out.values())
    return nproc, out


def _compare(ranks: list[dict], reference: dict, key: str, rtol: float, atol: float) -> None:
    seen: set[str] = set()
    for r in ranks:
        for name, values in r[key].items():
            assert name not in seen, f"{name} appears on two stages"
            seen.add(name)
            want = reference[key][name].reshape(-1)
            torch.testing.assert_close(torch.tensor(values), want, rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")
    assert seen == reference["names"], "every parameter lives on exactly one stage"


@distributed
@pytest.mark.parametrize("case", OURS + TORCH)
def test_pipeline_step_equals_single_process(runs, reference, case):
    nproc, by_case = runs
    ranks = by_case[case]
    for r in ranks:  # every rank reports the same loss, the whole batch's mean
        assert r["loss"] == pytest.approx(reference["loss"], rel=1e-6, abs=1e-6)
    _compare(ranks, reference, "grads", rtol=1e-4, atol=1e-6)
    _compare(ranks, reference, "after", rtol=1e-5, atol=1e-6)  # one optimizer step: identical weights


@distributed
def test_in_flight_activations_afab_vs_1f1b(runs):
    nproc, by_case = runs
    m = W.MICRO
    assert [r["max_in_flight"] for r in by_case["afab"]] == [m] * nproc  # every micro-batch alive at once
    one = [r["max_in_flight"] for r in by_case["1f1b"]]
    assert one == [min(nproc - rank, m) for rank in range(nproc)] and max(one) <= nproc
    assert [r["max_in_flight"] for r in by_case["naive"]] == [1] * nproc
    # activations kept for backward: 1F1B's peak is a fraction of AFAB's on every stage
    for a, b in zip(by_case["afab"], by_case["1f1b"]):
        assert b["peak_activation_bytes"] < a["peak_activation_bytes"]
    # the events: every micro-batch ran forward then backward once on every rank, in 1F1B order
    for r in by_case["1f1b"]:
        order = [(e["kind"], e["mb"]) for e in r["events"]]
        assert order == one_f_one_b_actions(r["rank"], nproc, m)
    assert by_case["afab"][0]["gathered"] == nproc and by_case["afab"][1]["gathered"] is None


# ----------------------------------------------------------------------------------------------------
# Single-process pieces: split, schedules as lists, bad configurations
# ----------------------------------------------------------------------------------------------------
def test_split_by_layers_and_by_params():
    assert split_layers(8, 4) == [range(0, 2), range(2, 4), range(4, 6), range(6, 8)]
    assert split_layers(5, 2) == [range(0, 3), range(3, 5)]
    # a big embedding and head: the end stages get fewer layers
    parts = split_layers(8, 4, by="params", layer_costs=[10] * 8, first_cost=25, last_cost=25)
    assert [len(r) for r in parts] == [1, 3, 3, 1]
    model = Llama(W.CFG.replace(vocab_size=2048), seed=0)
    stages = split_model(model, 4, by="params")
    assert [len(s.layer_ids) for s in stages][0] < 2 and sum(len(s.layer_ids) for s in stages) == 8
    assert stages[0].embed_tokens is model.embed_tokens and stages[-1].lm_head is model.lm_head  # shared, not copied


def test_stages_chained_equal_the_model():
    model = W.make_model()
    ids, _ = W.make_batch()
    x = ids
    for stage in split_model(model, 3):
        x = stage(x)
    torch.testing.assert_close(x, model(ids), rtol=0, atol=0)


def test_single_process_pipe_accumulates_the_full_gradient():
    model = W.make_model()
    ids, labels = W.make_batch()
    pipe = Pipe(build_stage(model, 0, 1), (ids, labels), 4)
    stats = train_step(pipe, "afab")
    ref = W.make_model()
    loss = ref.loss(ids, labels)
    loss.backward()
    assert stats.loss == pytest.approx(loss.item(), rel=1e-6)
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6)
    # one stage: every micro-batch's forward, then every backward, logged once each, nothing in flight at the
    # end; no transfer was ever asked for (counted events, not wall-clock time: a loaded machine cannot fail it)
    assert [(e.kind, e.mb) for e in stats.events] == [("F", i) for i in range(4)] + [("B", i) for i in range(4)]
    assert stats.max_in_flight == 4 and pipe.in_flight == 0 and pipe.batches_posted == 0
    assert all(e.rank == 0 and e.chunk == 0 and e.end >= e.start for e in stats.events)


def test_bubble_fraction_counts_idle_time():
    """The measured bubble on hand-made event logs (no clock involved)."""
    # two ranks over a 4-second span: rank 0 busy 0-1 and 3-4, rank 1 busy 1-3: idle 2 s and 2 s of 4
    log = [[Event(0, 0, "F", 0.0, 1.0), Event(0, 0, "B", 3.0, 4.0)],
           [Event(1, 0, "F", 1.0, 2.0), Event(1, 0, "B", 2.0, 3.0)]]
    b = bubble_fraction([{"events": [e.__dict__ for e in evs]} for evs in log])
    assert b["span_s"] == 4.0 and b["busy_s"] == [2.0, 2.0] and b["idle_s"] == [2.0, 2.0] and b["bubble"] == 0.5
    # one rank always busy: no bubble
    assert bubble_fraction([{"events": [Event(0, 0, "F", 0.0, 1.0).__dict__, Event(0, 0, "B", 1.0, 3.0).__dict__]}]
                           )["bubble"] == 0.0
    with pytest.raises(ValueError, match="no events to measure"):
        bubble_fraction([{"events": []}])


def test_a_micro_batch_without_backward_is_an_error():
    pipe = Pipe(build_stage(W.make_model(), 0, 1), W.make_batch(), 2)
    pipe.reset()
    for mb in range(2):
        pipe.forward_compute(mb, pipe.recv_forward(mb))
    pipe.backward_compute(0, None)
    with pytest.raises(RuntimeError, match=r"micro-batch\(es\) \[1\] never ran backward"):
        pipe.finish()


def test_schedule_orders():
    assert one_f_one_b_actions(0, 4, 8)[:4] == [("F", 0), ("F", 1), ("F", 2), ("F", 3)]
    assert one_f_one_b_actions(3, 4, 8)[:4] == [("F", 0), ("B", 0), ("F", 1), ("B", 1)]
    for rank in range(4):
        acts = one_f_one_b_actions(rank, 4, 8)
        assert sorted(acts) == sorted([("F", i) for i in range(8)] + [("B", i) for i in range(8)])
        inter = interleaved_actions(rank, 4, 8, 2)
        assert sorted(inter) == sorted([(k, i, c) for k in "FB" for i in range(8) for c in range(2)])
    assert bubble_theory(4, 8) == pytest.approx(3 / 11) and bubble_theory(4, 8, 2) == pytest.approx(3 / 19)


def test_bad_configurations_say_what_to_do():
    with pytest.raises(ValueError, match="batch 6 cannot be cut into 4 equal micro-batches: choose micro_batches among"):
        micro_batch_size(6, 4)
    with pytest.raises(ValueError, match="5 stages for 4 layers: every stage needs at least one layer"):
        split_layers(4, 5)
    with pytest.raises(ValueError, match=r"world size 3 != 2 pipeline stages: launch one process per stage"):
        check_world_size(3, 2)
    with pytest.raises(ValueError, match=r"world size 6 is not 4 stages x 2 data-parallel replicas = 8"):
        check_world_size(6, 4, data_parallel=2)
    check_world_size(8, 4, data_parallel=2)
    stage = build_stage(W.make_model(), 0, 4)  # a stage of a 4-stage split, in a world of 2
    with pytest.raises(ValueError, match="world size != number of stages"):
        Pipe(stage, W.make_batch(), 2, rank=0, world_size=2)
    with pytest.raises(ValueError, match="cannot be cut into 3 equal micro-batches"):
        Pipe(build_stage(W.make_model(), 0, 1), W.make_batch(), 3)
    with pytest.raises(ValueError, match="tie_embeddings=False"):
        split_model(Llama(W.CFG.replace(tie_embeddings=True)), 2)
    with pytest.raises(ValueError, match="micro_batches=1"):
        train_step(Pipe(build_stage(W.make_model(), 0, 1), W.make_batch(), 2), "naive")
    with pytest.raises(ValueError, match="multiple of 4"):
        interleaved_actions(0, 4, 6, 2)


def test_checkers_report_a_wrong_schedule():
    from dlo.course import checks
    from dlo.parallel.pipeline import afab_step

    # AFAB is not 1F1B: shown on the smallest case where they differ, one stage and two micro-batches
    with pytest.raises(checks.CheckFailed, match=r"with p=1 stage, m=2 micro-batches, rank 0: 2 forward\(s\) before "
                                                 r"the first backward, this stage needs 1"):
        checks.check("pipeline", "1f1b", one_f_one_b_step=afab_step)

    def forgets_backward(pipe):
        pipe.send_forward(0, pipe.forward_compute(0, pipe.recv_forward(0)))

    with pytest.raises(checks.CheckFailed, match="every micro-batch needs a forward and a backward"):
        checks.check("pipeline", "naive", naive_step=forgets_backward)

    from dlo.parallel.pipeline.schedules import _backward, _forward

    def per_action_interleaved(pipe):  # the right computes, but each with its own transfers
        for kind, mb, c in interleaved_actions(pipe.rank, pipe.world_size, pipe.micro_batches, len(pipe.chunks)):
            (_forward if kind == "F" else _backward)(pipe, mb, c)

    with pytest.raises(checks.CheckFailed, match=r"(?s)would wait for each other forever.*deadlock.*step by step"):
        checks.check("pipeline", "interleaved", interleaved_step=per_action_interleaved)


# ----------------------------------------------------------------------------------------------------
# The workshop script: its schedules on NCCL, its full profile planned for 1 to 8 GPUs
# ----------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def workshop():
    return _load(WORKSHOP / "pipeline_train.py", "_dlo_test_pipeline_train")


def test_workshop_solutions_cannot_deadlock_on_nccl(workshop):
    for name, fn in (("naive", workshop.naive_step), ("afab", workshop.afab_step), ("1f1b", workshop.one_f_one_b_step),
                     ("interleaved", workshop.interleaved_step)):
        for p in (2, 3, 4, 8):
            configs = [(1, 1)] if name == "naive" else [(p, v) for v in (1, 2, 3)] if name == "interleaved" else \
                [(m, 1) for m in (1, p - 1, p + 1, 2 * p)]
            for m, v in configs:
                result = replay_schedule(fn, p, m, v)
                assert result.ok, f"{name}, p={p}, m={m}, v={v}:\n{result.explain()}"


def _full_profile() -> dict:
    """The notebook's full-profile settings, read from its PROFILES cell (all but nprocs, the GPU count)."""
    nb = json.loads((WORKSHOP / "pipeline.ipynb").read_text())
    for cell in nb["cells"]:
        src = "".join(cell["source"])
        if cell["cell_type"] == "code" and "PROFILES = {" in src:
            for node in ast.walk(ast.parse(src)):
                if isinstance(node, ast.Dict) and any(getattr(k, "value", None) == "full" for k in node.keys):
                    call = node.values[[k.value for k in node.keys].index("full")]
                    return {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords if kw.arg != "nprocs"}
    raise AssertionError("no PROFILES cell with a 'full' profile in pipeline.ipynb")


def _full_args(workshop, schedules=None):
    S = _full_profile()
    argv = ["--layers", S["layers"], "--hidden", S["hidden"], "--heads", S["heads"], "--vocab", S["vocab"],
            "--seq", S["seq"], "--batch", S["batch"], "--steps", S["steps"], "--warmup-steps", S["warmup_steps"],
            "--schedules", *(schedules or [*workshop.OURS, *workshop.LIBRARIES]),
            "--micro-batches", *S["micro_batches"]]
    return workshop.parse_args([str(a) for a in argv]), S


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_full_profile_is_planned_before_launch(workshop, world):
    """Every full-profile configuration is either runnable or skipped with its reason, for 1 to 8 GPUs; on
    8 GPUs m=4 cannot run interleaved 1F1B (groups of p micro-batches) nor torch's Schedule1F1B (m >= p)."""
    args, S = _full_args(workshop)
    runs, skipped = workshop.plan(args, world)
    wanted = [(s, m) for s in args.schedules for m in ([1] if s == "naive" else S["micro_batches"])]
    assert sorted(runs + [(r["schedule"], r["micro_batches"]) for r in skipped]) == sorted(wanted)
    for r in skipped:
        assert r["kind"] == "pipeline" and r["stages"] == world and "\n" not in r["skipped"] and r["skipped"]
    skipped_keys = {(r["schedule"], r["micro_batches"]) for r in skipped}
    import importlib.util

    if importlib.util.find_spec("deepspeed") is None and world > 1:  # a GPU node without DeepSpeed: only its rows
        missing = {k for k in skipped_keys if k[0] == "deepspeed"}  # are skipped, each saying why
        assert missing == {("deepspeed", m) for m in S["micro_batches"]}
        assert all("deepspeed" in r["skipped"].lower() for r in skipped if r["schedule"] == "deepspeed")
        skipped_keys -= missing
    if world == 1:
        assert skipped_keys == {(s, m) for s in workshop.LIBRARIES for m in S["micro_batches"]}
    elif world == 8:
        assert skipped_keys == {("interleaved", 4), ("torch_1f1b", 4)}
        reasons = {(r["schedule"], r["micro_batches"]): r["skipped"] for r in skipped}
        assert "use a multiple of 8, not 4" in reasons[("interleaved", 4)]
        assert "at least as many micro-batches as stages" in reasons[("torch_1f1b", 4)]
    else:
        assert skipped_keys == set()
    # what is planned really passes the checks a run makes
    for schedule, m in runs:
        micro_batch_size(args.batch, m)
        if schedule == "interleaved":
            interleaved_actions(world - 1, world, m, args.virtual)
            split_layers(args.layers, world * args.virtual)


def test_plan_reports_each_bad_setting(workshop):
    args = workshop.parse_args(["--layers", "4", "--batch", "12", "--micro-batches", "2", "4", "5", "8",
                                "--schedules", "naive", "afab", "interleaved", "torch_1f1b"])
    runs, skipped = workshop.plan(args, 4)
    assert runs == [("naive", 1), ("afab", 2), ("afab", 4), ("torch_1f1b", 4)]
    reasons = {(r["schedule"], r["micro_batches"]): r["skipped"] for r in skipped}
    assert len(reasons) == 9
    assert reasons[("afab", 5)].startswith("batch 12 cannot be cut into 5 equal micro-batches")
    assert reasons[("interleaved", 4)].startswith("8 stages for 4 layers")  # 4 ranks x 2 chunks
    assert reasons[("torch_1f1b", 2)].endswith("at least as many micro-batches as stages: 2 < 4")
    assert reasons[("torch_1f1b", 8)].startswith("batch 12 cannot be cut into 8")
    assert workshop.plan(args, 1)[1][-1]["skipped"] == "torch_1f1b needs at least 2 stages: launch with nproc >= 2"


def test_schedule_order_failures_name_the_warm_up_only_when_it_is_wrong():
    """The 1F1B / interleaved checkers say how many forwards come before the first backward and how many this stage
    needs only when those differ; a steady-state mistake gets the action that differs, and neither message gives a
    formula for the warm-up."""
    from dlo.course.checks.pipeline import _order_problem
    from dlo.parallel.pipeline import one_f_one_b_actions

    want = one_f_one_b_actions(0, 4, 8)  # 3 warm-up forwards, then the first steady forward, then B0
    long_warmup = one_f_one_b_actions(0, 5, 8)  # one warm-up forward too many
    message = _order_problem(long_warmup, want)
    assert "5 forward(s) before the first backward, this stage needs 4" in message
    newest_first = list(want)
    newest_first[6], newest_first[8] = want[8], want[6]  # B2 before B1: not the oldest waiting micro-batch
    message = _order_problem(newest_first, want)
    assert "warm-up is right" in message and "action 6 (steady state) should be ('B', 1)" in message
    assert "before the first backward" not in message
    for text in (_order_problem(long_warmup, want), message):
        assert "min(" not in text and "rank - 1" not in text
