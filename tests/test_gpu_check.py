"""``dlo gpu-check``: the full-profile commands are valid for 1, 2, 4 and 8 GPUs before any GPU runs them, each
parser reads its records right, a crash in one benchmark does not stop the others, and the dry run (CPU,
smoke size) runs end to end."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from dlo.measure.bench import Measurement

from dlo.cli import build_parser
from dlo.course import gpu_benchmarks as gb
from dlo.course import gpu_check as gc
from dlo.course.checks import load_exercises
from dlo.course.notebooks import parse_value, source_notebooks
from dlo.course.runner import check_request
from dlo.lessons import mixing, race
from dlo.runtime.launch import LaunchError
from dlo.runtime.paths import ROOT

BY_NAME = {b.name: b for b in gc.BENCHMARKS}


def _script(path: str) -> dict:
    return load_exercises(ROOT / path)


@pytest.mark.parametrize("gpus", [1, 2, 4, 8])
def test_every_full_profile_command_is_valid_for_this_many_gpus(gpus, tmp_path):
    """What a GPU node would run, checked with the scripts' own argument parsers and size checks."""
    for bench in gc.BENCHMARKS:
        if gpus < bench.min_gpus:
            continue
        command = bench.command(gpus, False, tmp_path)
        if command[0] == "module":
            args = command[1]
            if args[0] == "run":
                quick = bench.command(gpus, False, tmp_path, True)[1]
                assert quick[:len(args)] == args and quick[len(args):] == [
                    a for k, v in gb.JOUR1_QUICK.items() for a in ("-p", k, v)]
                check_request(parsed_quick := build_parser().parse_args(quick).notebook, profile="full",
                              parameters={k: parse_value(v) for k, v in gb.JOUR1_QUICK.items()},
                              out_dir=tmp_path / "jour1q", validate=False)
                assert parsed_quick.endswith("jour1.ipynb")
                parsed = build_parser().parse_args(args)
                check_request(parsed.notebook, profile=parsed.profile, out_dir=tmp_path / "jour1",
                              validate=False)  # the notebook's own checks: tests/test_dry_run.py
            elif args[0] == "mix-bench":
                mixing._parser().parse_args(args[1:])
            elif args[0] == "race":
                parsed = race._parser().parse_args(args[1:])
                assert parsed.recipe == "reference" and parsed.target == 0.94 and not parsed.generated
            else:  # pragma: no cover - a new benchmark must be added here
                raise AssertionError(f"no check for {args[0]}")
            continue
        _, script, args, nproc = command
        assert nproc == gpus, f"{bench.name}: one process per GPU"
        ns = _script(script)
        parsed = ns["parse_args"](args)
        if bench.name == "pipeline_1f1b":
            runs, skipped = ns["plan"](parsed, gpus)
            assert runs == [("1f1b", 4 * gpus)] and skipped == []
        elif bench.name == "tp_vs_dtensor":
            (layout,) = parsed.layouts
            tp = int(layout.split("x")[0])
            assert tp == gpus and set(parsed.impls) == {"scratch", "dtensor"}
            for what in ("hidden", "heads", "kv_heads", "intermediate", "vocab"):
                assert getattr(parsed, what) % tp == 0, f"{what} must divide by tp={tp}"
            assert parsed.hidden % parsed.heads == 0 and parsed.heads % parsed.kv_heads == 0
        elif bench.name == "grid_3d":
            from dlo.parallel.grid_step import why_invalid

            assert parsed.dp * parsed.pp * parsed.tp == gpus and parsed.compare and parsed.schedules == ["1f1b"]
            assert why_invalid(ns["make_config"](parsed), world_size=gpus, dp=parsed.dp, pp=parsed.pp, tp=parsed.tp,
                               batch=parsed.batch, micro_batches=parsed.micro_batches, schedule="1f1b",
                               virtual=parsed.virtual) is None
            assert (parsed.pp, parsed.tp) == ((2, 2) if gpus >= 4 else (1, 2))
        elif bench.name == "fsdp_mfu":
            from dlo.measure.memory import GB, fsdp2_peak_memory
            from dlo.parallel.fsdp import MODEL_CONFIGS

            assert parsed.model == "llama-3.2-3b" and parsed.precision == "bf16"
            assert parsed.global_batch % (gpus * parsed.grad_accum) == 0
            micro = parsed.global_batch // (gpus * parsed.grad_accum)
            plan = gc.fsdp_plan(gpus)  # no GPU here: sized for an 80 GB one
            assert (micro, parsed.seq_len, parsed.grad_accum, parsed.accum_sync, parsed.checkpointing) == \
                (plan["micro_batch"], 2048, plan["grad_accum"], plan["accum_sync"], plan["checkpointing"])
            assert micro * parsed.grad_accum == 16 and parsed.timed_repeats >= 5
            assert (parsed.loss, parsed.optimizer_impl, parsed.compile) == ("chunked", "fused", True)
            # what the memory calculator predicts for this very command fits an 80 GB H100 with its margin
            peak = fsdp2_peak_memory(MODEL_CONFIGS[parsed.model], gpus, batch=micro, seq_len=parsed.seq_len,
                                     precision=parsed.precision, checkpointing=parsed.checkpointing,
                                     loss=parsed.loss, loss_chunk_tokens=parsed.loss_chunk_tokens,
                                     optimizer_impl=parsed.optimizer_impl, grad_accum=parsed.grad_accum,
                                     accum_sync=parsed.accum_sync)
            assert peak["total"] == plan["predicted_bytes"] and peak["total"] * 1.12 < 80 * GB, (gpus, peak["total"])


def test_the_dry_runs_are_the_full_commands_of_a_2_gpu_node_with_only_sizes_shrunk(tmp_path):
    launched = 0
    for bench in gc.BENCHMARKS:
        command = bench.command(8, True, tmp_path)
        if command[0] != "launch":
            continue
        launched += 1
        full = bench.command(gc.DRY_GPUS, False, tmp_path)
        assert command[3] == gc.DRY_GPUS == full[3] and command[1] == full[1]
        dry_args, full_args = command[2], full[2]
        assert len(dry_args) == len(full_args)
        changed = {full_args[i - 1] for i, (a, b) in enumerate(zip(dry_args, full_args)) if a != b}
        assert changed and changed <= set(gc.DRY_SIZES), f"{bench.name}: a dry run may change sizes only: {changed}"
        dry, real = _script(command[1])["parse_args"](dry_args), _script(command[1])["parse_args"](full_args)
        for flag in ("precision", "checkpointing", "schedules", "micro_batches", "layouts", "impls", "dtype", "dp", "pp",
                     "tp", "compare", "batch"):
            assert getattr(dry, flag, None) == getattr(real, flag, None), f"{bench.name}: {flag} differs"
    assert launched == 4


def test_shrink_replaces_only_the_values_of_size_flags():
    args = ["--model", "llama-3.2-3b", "--precision", "bf16", "--checkpointing", "--seq-len", "2048", "--steps", "12"]
    assert gb.shrink(args) == ["--model", "smoke", "--precision", "bf16", "--checkpointing", "--seq-len", "32",
                               "--steps", "3"]
    assert gb.shrink(["--steps"]) == ["--steps"]  # a flag with no value after it is left alone


def test_parsers_read_their_records(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps({"final_speedup": 12.5, "final_step": "6 batch 512",
                                                       "final_decision": "faster"}))
    assert gb._jour1_parse(tmp_path, None)[0] == 12.5
    (tmp_path / "results.json").write_text(json.dumps({"final_speedup": None, "final_sentence": "No ratio: x."}))
    value, details = gb._jour1_parse(tmp_path, None)
    assert value is None and "No ratio" in details["why"]

    fsdp = [{"rank": 1, "status": "ok", "mfu": 0.9}, {"rank": 0, "status": "ok", "mfu": 0.42, "tokens_per_s": 1}]
    assert gb._fsdp_parse(tmp_path, fsdp)[0] == pytest.approx(42.0)  # the old output: mfu only
    oom = gb._fsdp_parse(tmp_path, [{"rank": 0, "status": "oom", "error": "CUDA out of memory"}])
    assert oom[0] is None and "out of memory" in oom[1]["why"]

    pipe = [{"kind": "pipeline", "schedule": "1f1b", "bubble": 0.30, "bubble_theory": 0.25, "rank": 0},
            {"kind": "pipeline", "schedule": "afab", "bubble": 0.9, "bubble_theory": 0.25, "rank": 0}]
    assert gb._pipeline_parse(tmp_path, pipe)[0] == pytest.approx(20.0)

    tp = [{"kind": "layout", "impl": "scratch", "step_s_median": 0.10, "rank": 0},
          {"kind": "layout", "impl": "dtensor", "step_s_median": 0.08, "rank": 0},
          {"kind": "layout", "impl": "scratch", "step_s_median": 9.0, "rank": 1}]
    assert gb._tp_parse(tmp_path, tp)[0] == pytest.approx(0.8)

    grid = [{"rank": r, "dp": 2, "pp": 2, "tp": 2, "step_s": 0.1 * (r + 1), "comm_matches_theory": True,
             "diff": {"grad": 1e-6 * r, "after": 2e-6}} for r in range(8)]
    value, details = gb._grid_parse(tmp_path, grid)
    assert value == pytest.approx(7e-6) and details["step_s"] == pytest.approx(0.8)
    grid[3]["comm_matches_theory"] = False
    value, details = gb._grid_parse(tmp_path, grid)
    assert value == pytest.approx(7e-6) and "rank(s) [3]" in details["missed"]
    assert gc.verdict(BY_NAME["grid_3d"], value, details, dry=False).startswith("MISSED: communication differs")
    assert gb._grid_parse(tmp_path, [{k: v for k, v in grid[0].items() if k != "diff"}])[0] is None

    race_out = {"target": 0.94, "records": [{"data": "real CIFAR-10", "reached": True, "time_to_target_s": 9.0},
                                            {"data": "real CIFAR-10", "reached": False, "time_to_target_s": None}]}
    (tmp_path / "race.json").write_text(json.dumps(race_out))
    assert gb._race_parse(tmp_path, None)[0] == pytest.approx(9.0 / gb.AIRBENCH94_A100_S)
    race_out["records"][0]["data"] = "generated"
    (tmp_path / "race.json").write_text(json.dumps(race_out))
    assert gb._race_parse(tmp_path, None)[0] is None


@pytest.mark.parametrize("name, value, verdict", [("mixcutmix", 50.0, "met"), ("mixcutmix", 49.9, "MISSED"),
                                                  ("pipeline_1f1b", 15.0, "met"), ("pipeline_1f1b", 15.1, "MISSED"),
                                                  ("race", 2.9, "met"), ("race", 3.5, "MISSED")])
def test_targets_are_judged_in_their_direction(name, value, verdict):
    assert gc.verdict(BY_NAME[name], value, {}, dry=False) == verdict
    assert gc.verdict(BY_NAME[name], value, {}, dry=True) == "dry run: not judged"
    assert gc.verdict(BY_NAME[name], None, {"why": "not steady"}, dry=False) == "no value: not steady"


def test_one_crash_does_not_stop_the_others_and_small_nodes_skip(monkeypatch, tmp_path):
    calls = []

    def fake_run(bench, gpus, dry, out, **_):
        calls.append(bench.name)
        if bench.name == "mixcutmix":
            raise LaunchError("rank 0 failed with exit code 1: CUDA error: an illegal memory access")
        if bench.name == "fsdp_mfu":
            return [{"rank": 0, "status": "ok", "mfu": 0.45}]
        raise RuntimeError("exit code 2: error: something")

    monkeypatch.setattr(gc, "_run_one", fake_run)
    payload = gc.run_checks(gpus=1, out_path=tmp_path / "r.json", log=lambda s: None)
    rows = {r["benchmark"]: r for r in payload["results"]}
    assert calls == ["jour1_ladder", "mixcutmix", "fsdp_mfu"]  # the 2-GPU ones are not started
    # without the real CIFAR-10 (none here), the race says so instead of training on generated data for nothing
    assert rows["race"]["verdict"] == ("skipped: needs the real CIFAR-10 (set DLO_DATA_DIR to the folder holding "
                                       "cifar-10-batches-py)")
    assert rows["pipeline_1f1b"]["verdict"] == rows["tp_vs_dtensor"]["verdict"] == "skipped: needs 2 GPUs, 1 visible"
    crashed = rows["mixcutmix"]["verdict"]
    assert crashed.startswith("failed: ") and "illegal memory access" in crashed
    assert rows["fsdp_mfu"]["verdict"] == "met" and rows["fsdp_mfu"]["value"] == pytest.approx(45.0)
    assert json.loads((tmp_path / "r.json").read_text())["results"] == json.loads(json.dumps(payload["results"]))
    table = gc.format_table(payload["results"])
    assert len(table.splitlines()) == 1 + len(gc.BENCHMARKS)


def test_bad_requests_are_one_line_before_anything_runs(monkeypatch, tmp_path):
    monkeypatch.setattr(gc, "_run_one", lambda *a: pytest.fail("nothing may run"))
    with pytest.raises(ValueError, match="no GPU is visible"):
        gc.run_checks(gpus=0, out_path=tmp_path / "r.json")
    with pytest.raises(ValueError, match="unknown benchmark 'mfu'"):
        gc.run_checks(dry_run=True, only=["mfu"], out_path=tmp_path / "r.json")


def test_quick_dry_run_end_to_end_on_cpu(tmp_path):
    """``--quick --dry-run``, what CI runs of the GPU acceptance run: notebooks' dry profiles through the plain engine
    (one that runs, one that needs two GPUs, one that imports a package this Python lacks, one that fails; every
    course notebook's dry profile goes through the same function in tests/test_dry_profiles.py), then every
    benchmark's real command at smoke size on 2 gloo processes (Jour 1's smoke profile is run by nbval)."""
    out = tmp_path / "dry.json"
    notebooks = ["tests/fixtures/plain_display.ipynb", "tests/fixtures/needs_two_gpus.ipynb",
                 "tests/fixtures/needs_a_missing_package.ipynb", "tests/fixtures/failing.ipynb"]
    done = subprocess.run([sys.executable, "-m", "dlo", "gpu-check", "--quick", "--dry-run", "--skip", "jour1_ladder",
                           "--notebooks", *notebooks, "--jobs", "2", "--budget", "600", "--out", str(out)],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]  # failing.ipynb fails
    payload = json.loads(out.read_text())
    assert payload["quick"] and payload["dry_run"] and payload["title"].startswith("DRY RUN (targets not judged)")
    rows = {r.get("benchmark") or r["notebook"]: r for r in payload["results"]}
    assert set(rows) == (set(BY_NAME) - {"jour1_ladder"}) | set(notebooks)
    ok = rows["tests/fixtures/plain_display.ipynb"]
    assert ok["verdict"] == "ok" and ok["seconds"] > 0, ok
    assert rows["tests/fixtures/needs_two_gpus.ipynb"]["verdict"].startswith("skipped: needs 2 GPUs, 1 visible")
    assert rows["tests/fixtures/needs_a_missing_package.ipynb"]["verdict"] == \
        "skipped: needs dlo_package_that_is_not_installed (not installed here)"
    failing = rows["tests/fixtures/failing.ipynb"]["verdict"]
    assert failing.startswith("failed: failing.ipynb: code cell 2 (answer = 1 / zero) failed with ZeroDivisionError")
    for name in ("pipeline_1f1b", "tp_vs_dtensor"):
        assert rows[name]["verdict"] == "dry run: not judged" and rows[name]["value"] > 0, rows[name]
    mix = rows["mixcutmix"]  # read when steady and decided; on a busy machine refused, saying why (never a pass)
    assert (mix["verdict"] == "dry run: not judged" and mix["value"] > 0) or \
        (mix["value"] is None and mix["verdict"].startswith("no value: refused: ")), mix
    assert rows["fsdp_mfu"]["details"]["status"] == "ok", rows["fsdp_mfu"]
    assert rows["fsdp_mfu"]["details"]["why"] == "unknown GPU: no MFU (cpu)"
    assert rows["race"]["verdict"].startswith("skipped: not in --quick"), rows["race"]
    assert "DRY RUN (targets not judged)" in done.stdout.splitlines()[done.stdout.splitlines().index(
        next(ln for ln in done.stdout.splitlines() if ln.startswith("notebook or benchmark"))) - 1]
    table = done.stdout[done.stdout.index("notebook or benchmark"):]
    assert len([ln for ln in table.splitlines() if ln.split()[0] in rows]) == len(rows)
    assert "dry run: not judged" in done.stdout and "wrote" in done.stdout


def test_quick_on_one_gpu_runs_the_target_benchmarks_first_then_the_notebooks(monkeypatch, tmp_path):
    rehearsed, ran = [], []

    def fake_rehearse(path, out, *, timeout_s, dry, env):
        rehearsed.append((path.name, timeout_s, dry))
        return {"notebook": path.name, "seconds": 1.0, "verdict": "ok"}

    def fake_run(bench, gpus, dry, out, *, quick, timeout_s):
        ran.append((bench.name, quick, timeout_s))
        assert not rehearsed, "the notebooks start after the benchmarks"
        command = bench.command(gpus, dry, out, quick)
        if bench.name == "fsdp_mfu":
            args = command[2]
            assert args[args.index("--steps") + 1] == gb.FSDP_QUICK["--steps"]
            assert args[args.index("--timed-repeats") + 1] == gb.FSDP_QUICK["--timed-repeats"]
            assert args[args.index("--model") + 1] == "llama-3.2-3b"  # same sizes, fewer steps
            return [{"rank": 0, "status": "ok", "mfu": 0.41}]
        raise RuntimeError("exit code 1: not measured here")

    monkeypatch.setattr(gc, "rehearse_notebook", fake_rehearse)
    monkeypatch.setattr(gc, "_run_one", fake_run)
    monkeypatch.setattr(gc, "BENCHMARKS", tuple(dataclasses.replace(b, unavailable=lambda dry: None)
                                                if b.name == "race" else b for b in gc.BENCHMARKS))
    payload = gc.run_checks(gpus=1, quick=True, jobs=3, out_path=tmp_path / "q.json", log=lambda s: None)
    assert sorted(name for name, _, _ in rehearsed) == sorted(p.name for p in source_notebooks())
    assert all(t <= gc.NOTEBOOK_TIMEOUT_S and not dry for _, t, dry in rehearsed)
    assert [(name, t) for name, _, t in ran] == [(n, gc.gpu_budget.QUICK_CAPS_S[n])
                                                 for n in ("fsdp_mfu", "jour1_ladder", "mixcutmix")]
    assert all(quick for _, quick, _ in ran)
    rows = {r.get("benchmark") or r["notebook"]: r for r in payload["results"]}
    assert [r.get("benchmark") for r in payload["results"][:3]] == ["fsdp_mfu", "jour1_ladder", "mixcutmix"]
    for name in ("pipeline_1f1b", "tp_vs_dtensor", "grid_3d"):
        assert rows[name]["verdict"] == "skipped: needs 2 GPUs, 1 visible"
    assert rows["race"]["verdict"].startswith("skipped: not in --quick")
    assert rows["fsdp_mfu"]["verdict"] == "met" and rows["fsdp_mfu"]["plan"]["device_gb"] == 80
    assert gc.failed(payload["results"]) == ["jour1_ladder", "mixcutmix"]
    assert payload["title"].startswith("gpu-check quick acceptance run") and "DRY RUN" not in payload["title"]


def test_the_one_gpu_caps_fit_the_8_minute_piece_and_the_help_shows_their_sum():
    from dlo.course import gpu_budget as gb

    assert gb.QUICK_ORDER[:3] == ("fsdp_mfu", "jour1_ladder", "mixcutmix")
    total = sum(gb.QUICK_CAPS_S[n] for n in gb.QUICK_ORDER[:3])
    assert gb.one_gpu_caps_s() == total and total + gb.NOTEBOOK_NEED_S <= gb.QUICK_BUDGET_S <= 480 - 30
    assert all(gb.QUICK_NEEDS_S[n] <= gb.QUICK_CAPS_S[n] for n in gb.QUICK_CAPS_S)
    help_text = " ".join(subprocess.run([sys.executable, "-m", "dlo", "gpu-check", "--help"], capture_output=True,
                                        text=True, timeout=120, cwd=ROOT).stdout.split())
    assert f"caps summing to {total:.0f} s" in help_text and "fsdp_mfu 180 s, then jour1_ladder 150 s" in help_text


def test_quick_budget_caps_every_step_and_reports_what_could_not_start(monkeypatch, tmp_path):
    """Benchmarks first, each under min(its cap, what is left); one that needs more than is left is not started
    ("not run: N s left, it needs M s"); then the notebooks in what is left, likewise."""
    clock = [1000.0]
    monkeypatch.setattr(gc.time, "monotonic", lambda: clock[0])
    timeouts, bench_timeouts = [], []

    def fake_rehearse(path, out, *, timeout_s, dry, env):
        timeouts.append(timeout_s)
        clock[0] += 40.0  # each notebook takes 40 s
        return {"notebook": path.name, "seconds": 40.0, "verdict": "ok"}

    def fake_run(bench, gpus, dry, out, *, quick, timeout_s):
        bench_timeouts.append((bench.name, timeout_s))
        clock[0] += timeout_s  # each benchmark runs to its cap
        raise gc.StepTimedOut(timeout_s, "still compiling")

    monkeypatch.setattr(gc, "rehearse_notebook", fake_rehearse)
    monkeypatch.setattr(gc, "_run_one", fake_run)
    nbs = ["Jour1/shapes.ipynb", "Jour1/jour1.ipynb", "Jour2/ddp.ipynb"]
    payload = gc.run_checks(gpus=1, quick=True, jobs=1, budget_s=400, notebooks=nbs,
                            only=["fsdp_mfu", "jour1_ladder", "mixcutmix"], out_path=tmp_path / "q.json",
                            log=lambda s: None)
    # fsdp: its 180 s cap; jour1: 220 s left, its 150 s cap; mixcutmix: 70 s left, its 45 s cap; notebooks: 25 s left
    assert bench_timeouts == [("fsdp_mfu", 180.0), ("jour1_ladder", 150.0), ("mixcutmix", 45.0)]
    assert timeouts == [25.0]  # the first notebook: capped at what is left
    verdicts = [r["verdict"] for r in payload["results"]]
    assert verdicts == ["timed out after 180 s", "timed out after 150 s", "timed out after 45 s", "ok",
                        "not run: 0 s left, it needs 20 s", "not run: 0 s left, it needs 20 s"]
    assert gc.failed(payload["results"]) == []  # timeouts and not-run rows are not failures

    clock[0], bench_timeouts[:] = 1000.0, []
    payload = gc.run_checks(gpus=1, quick=True, budget_s=250, notebooks=nbs[:1], only=["fsdp_mfu", "jour1_ladder"],
                            out_path=tmp_path / "q2.json", log=lambda s: None)
    assert bench_timeouts == [("fsdp_mfu", 180.0)]  # 70 s left: less than jour1 needs
    assert [r["verdict"] for r in payload["results"]][1:] == ["not run: 70 s left, it needs 90 s", "ok"]
    clock[0], bench_timeouts[:] = 1000.0, []
    gc.run_checks(gpus=1, quick=True, budget_s=120, notebooks=nbs[:1], only=["fsdp_mfu"],
                  out_path=tmp_path / "q3.json", log=lambda s: None)
    assert bench_timeouts == [("fsdp_mfu", 120.0)]  # never more than the budget left


@pytest.mark.parametrize("final_speedup, shown", [("12.5", "'12.5'"), (float("nan"), "nan"), (float("inf"), "inf"),
                                                  (True, "True"), ([7], "[7]")])
def test_a_malformed_value_is_one_invalid_row_and_the_table_is_written(monkeypatch, tmp_path, final_speedup, shown):
    """A results.json whose final_speedup is a string, NaN or inf: 'invalid: final_speedup is ...', never met/MISSED,
    never an exception that loses the other rows; not a failure either."""
    def fake_run(bench, gpus, dry, out, **_):
        if bench.name == "jour1_ladder":
            (out / "results.json").write_text(json.dumps({"final_speedup": final_speedup, "final_decision": "faster"}))
            return None
        if bench.name == "mixcutmix":
            (out / "mix.json").write_text(json.dumps({"rows": []}))  # not mix-bench's shape
            return None
        return [{"rank": 0, "status": "ok", "mfu": float("nan")}]

    monkeypatch.setattr(gc, "_run_one", fake_run)
    payload = gc.run_checks(gpus=1, only=["jour1_ladder", "mixcutmix", "fsdp_mfu"], out_path=tmp_path / "r.json",
                            log=lambda s: None)
    rows = {r["benchmark"]: r for r in payload["results"]}
    assert rows["jour1_ladder"]["verdict"] == f"invalid: final_speedup is {shown}" and rows["jour1_ladder"]["value"] is None
    assert rows["fsdp_mfu"]["verdict"] == "invalid: mfu is nan"
    assert rows["mixcutmix"]["verdict"].startswith("invalid: speedup could not be read (KeyError")
    assert all("\n" not in r["verdict"] for r in payload["results"]) and gc.failed(payload["results"]) == []
    assert len(json.loads((tmp_path / "r.json").read_text())["results"]) == 3
    assert len(gc.format_table(payload["results"], payload["title"]).splitlines()) == 2 + 3


def test_a_hanging_launch_is_killed_whole_at_its_cap_and_reads_timed_out(tmp_path):
    """A benchmark whose rank (under torchrun, as gpu-check launches it) starts `sleep 600` and a Python child with
    a grandchild, then hangs: at the cap the row says "timed out after N s", and none of them, nor torchrun, runs."""
    from dlo.runtime.process_tree import running

    pids_file = tmp_path / "pids.json"
    hang = gc.Benchmark("hang", "a rank that hangs", gb.Target("x", ">=", 1, "", "test"), 1,
                        lambda gpus, dry, out, quick=False: ("launch", "tests/scripts/gpu_check_hang.py",
                                                             [str(pids_file)], 1), lambda out, rec: (1.0, {}))
    row = gc._benchmark_row(hang, gpus=1, dry_run=True, quick=True, left=300.0, cap=45.0, need=1.0,
                            log=lambda s: None)
    assert row["verdict"] == "timed out after 45 s" and row["value"] is None and 45 <= row["seconds"] < 90
    assert pids_file.exists(), "the rank did not start within the cap on this machine"
    pids = json.loads(pids_file.read_text())
    assert set(pids) == {"rank", "launcher", "sleep", "child", "grandchild"}
    left = {name: pid for name, pid in pids.items() if running(pid)}
    assert not left, f"still running after the cap: {left}"


def test_quick_bad_requests_are_one_line_before_anything_runs(monkeypatch, tmp_path):
    monkeypatch.setattr(gc, "rehearse_notebook", lambda *a, **k: pytest.fail("nothing may run"))
    monkeypatch.setattr(gc, "_run_one", lambda *a, **k: pytest.fail("nothing may run"))
    for kwargs, message in [(dict(quick=True, notebooks=["Jour1/nope.ipynb"]), "no notebook at .*nope.ipynb"),
                            (dict(notebooks=["Jour1/jour1.ipynb"]), "--notebooks goes with --quick"),
                            (dict(quick=True, jobs=0), "--jobs must be at least 1"),
                            (dict(jobs=2), "--jobs and --budget go with --quick"),
                            (dict(quick=True, budget_s=-1), "--budget must be a positive number")]:
        with pytest.raises(ValueError, match=message):
            gc.run_checks(gpus=1, out_path=tmp_path / "r.json", **kwargs)


def test_a_notebook_that_needs_more_gpus_is_skipped_and_a_missing_import_is_named(tmp_path):
    """The notebook-level reasons, read from the run itself (TooFewGPUs's line) or from the notebook's imports."""
    from dlo.course.notebooks import imported_packages, missing_packages

    fixtures = ROOT / "tests" / "fixtures"
    assert missing_packages(fixtures / "needs_a_missing_package.ipynb") == ["dlo_package_that_is_not_installed"]
    assert imported_packages(fixtures / "needs_a_missing_package.ipynb") == \
        ["dlo_package_that_is_not_installed", "torch"]
    hpo = imported_packages(ROOT / "Jour4" / "hpo.ipynb")
    assert "optuna" in hpo and "IPython" in hpo and "IPython" not in missing_packages(ROOT / "Jour4" / "hpo.ipynb")
    row = gc.rehearse_notebook(fixtures / "needs_two_gpus.ipynb", tmp_path / "two", dry=True, timeout_s=300)
    assert row["verdict"].startswith("skipped: needs 2 GPUs, 1 visible (needs_two_gpus.ipynb: code cell 2"), row


# --------------------------------------------------------------------------------------------------
# Parsers refuse a value whose measurement is not steady or not decided
# --------------------------------------------------------------------------------------------------

def _timed(name, seconds, rounds=8, jitter=(0.99, 1.0, 1.01, 1.0), steady=True):
    return Measurement(name=name, times_s=[seconds * jitter[i % len(jitter)] for i in range(rounds)], items_per_call=16,
                       steady=steady).to_record()


def _mix(tmp_path, loop, batched):
    recs = []
    for kind in ("mixup", "cutmix"):
        recs += [{"kind": kind, "implementation": "loop", "speedup": 1.0, "measurement": loop},
                 {"kind": kind, "implementation": "batched", "measurement": batched,
                  "speedup": loop["median_s"] / batched["median_s"]}]
    (tmp_path / "mix.json").write_text(json.dumps({"records": recs}))
    return gb._mix_parse(tmp_path, None)


def test_mix_bench_is_read_only_when_steady_and_decided(tmp_path):
    value, details = _mix(tmp_path, _timed("loop", 1.0), _timed("batched", 0.02))
    assert value == pytest.approx(50.0) and details["spread_by_kind"]["mixup"]["loop"] == pytest.approx(0.005)
    # the dry run's 19x: a loop whose repeats spread over 100 % -- no value, and the line says why
    value, details = _mix(tmp_path, _timed("loop", 1.0, jitter=(0.5, 1.0, 2.0, 1.0)), _timed("batched", 0.05))
    assert value is None and details["why"].startswith("refused: mixup: unsteady (the repeats of loop spread over")
    value, details = _mix(tmp_path, _timed("loop", 1.0, rounds=3), _timed("batched", 0.02, rounds=3))
    assert value is None and "mixup: undecided (3 and 3 repeats are too few" in details["why"]
    (tmp_path / "mix.json").write_text(json.dumps({"records": [{"kind": "mixup", "implementation": "loop",
                                                                "speedup": 1.0},
                                                               {"kind": "mixup", "implementation": "batched",
                                                                "speedup": 80.0}]}))
    assert "no measurement recorded" in gb._mix_parse(tmp_path, None)[1]["why"]


def test_jour1_speedup_is_refused_unless_its_final_comparison_is_decided(tmp_path):
    steady = {"final": _timed("final", 0.5), "baseline": _timed("baseline", 1.0)}
    results = {"final_speedup": 2.0, "final_decision": "faster", "final_comparison": steady, "final_sentence": "s"}
    (tmp_path / "results.json").write_text(json.dumps(results))
    assert gb._jour1_parse(tmp_path, None)[0] == 2.0
    (tmp_path / "results.json").write_text(json.dumps({**results, "final_decision": "undecided"}))
    value, details = gb._jour1_parse(tmp_path, None)
    assert value is None and details["why"].startswith("refused: the final comparison is undecided")
    wild = {**steady, "baseline": _timed("baseline", 1.0, jitter=(0.3, 1.0, 3.0, 1.0))}
    (tmp_path / "results.json").write_text(json.dumps({**results, "final_comparison": wild}))
    assert "the final comparison is unsteady" in gb._jour1_parse(tmp_path, None)[1]["why"]
    (tmp_path / "results.json").write_text(json.dumps({"final_speedup": 1.0, "final_step": "0 baseline"}))
    assert "no decision was recorded" in gb._jour1_parse(tmp_path, None)[1]["why"]  # the old 1.0 is not a value


def test_jour1_is_judged_on_the_workload_that_fills_the_gpu(tmp_path):
    steady = {"final": _timed("final", 0.5), "baseline": _timed("baseline", 1.0)}
    cifar = {"final_speedup": 2.0, "final_decision": "faster", "final_comparison": steady, "final_sentence": "c"}
    second = {"ran": True, "workload": "ResNet-50, 3x224x224 generated images, 1000 classes, batch 256",
              "final_speedup": 3.0, "final_decision": "faster", "final_comparison": steady, "final_sentence": "r",
              "final_step": "3 + channels_last"}
    (tmp_path / "results.json").write_text(json.dumps({**cifar, "imagenet": second}))
    value, details = gb._jour1_parse(tmp_path, None)
    assert value == 3.0 and details["workload"].startswith("ResNet-50") and details["cifar_final_speedup"] == 2.0
    assert details["final_step"] == "3 + channels_last"
    (tmp_path / "results.json").write_text(json.dumps({**cifar, "imagenet": {**second, "final_decision": "undecided"}}))
    value, details = gb._jour1_parse(tmp_path, None)  # refused on the second workload, not read from CIFAR's
    assert value is None and details["why"].startswith("refused: the final comparison is undecided")
    (tmp_path / "results.json").write_text(json.dumps({**cifar, "imagenet": {"ran": False, "why": "no GPU here"}}))
    value, details = gb._jour1_parse(tmp_path, None)
    assert value == 2.0 and details["workload"] == gb.JOUR1_CIFAR
    assert details["second_workload"] == "not run: no GPU here"


def test_fsdp_mfu_reads_the_figure_with_the_lm_head_and_shows_both(tmp_path):
    rec = {"rank": 0, "status": "ok", "mfu": 0.42, "mfu_no_head": 0.37, "tokens_per_s": 1}
    value, details = gb._fsdp_parse(tmp_path, [rec])
    assert value == pytest.approx(42.0) and details["mfu_no_head"] == 0.37
    assert details["compared"] == ("mfu: LM head included, as torchtitan and Megatron count it (without the head: "
                                   "37.0 %)")
    value, details = gb._fsdp_parse(tmp_path, [{**rec, "timing": {"steady": False}}])
    assert value is None and "did not reach steady timings" in details["why"]


def test_the_help_lists_every_benchmark_name_only_takes():
    from dlo.cli import GPU_BENCHMARK_NAMES
    from dlo.course.gpu_benchmarks import BENCHMARKS

    assert GPU_BENCHMARK_NAMES == tuple(b.name for b in BENCHMARKS)


def test_fsdp_mfu_is_the_median_of_the_timed_repeats_with_its_spread_and_an_unsteady_one_is_said_so(tmp_path):
    """MFU per timed repeat = tokens per step / its time x model FLOPs per token / the device's peak; the value is
    their median, the band beside it; repeats that spread over the steadiness rule's limit give no value, saying so."""
    fpt, peak, tokens = 2.0e10, 989e12, 32768
    rec = {"rank": 0, "status": "ok", "mfu": 0.2, "flops_per_token": fpt, "peak_flops": peak, "predicted_gb": 64.5,
           "peak_memory_gb": 66.0, "micro_batch": 2, "grad_accum": 8, "accum_sync": "every",
           "checkpointing": "selective", "timing": _timed("fsdp", 2.0, rounds=10)}
    rec["timing"]["items_per_call"] = tokens
    value, details = gb._fsdp_parse(tmp_path, [rec])
    assert value == pytest.approx(100 * tokens / 2.0 * fpt / peak, rel=0.01)
    assert details["mfu_q25"] <= value <= details["mfu_q75"] and details["mfu_repeats"] == 10
    assert 0 < details["mfu_spread"] < 0.05 and (details["predicted_gb"], details["peak_memory_gb"]) == (64.5, 66.0)
    wild = {**rec, "timing": {**_timed("fsdp", 2.0, rounds=10, jitter=(0.5, 1.0, 2.0, 1.0)), "items_per_call": tokens}}
    value, details = gb._fsdp_parse(tmp_path, [wild])
    assert value is None and details["why"].startswith("refused: the MFU is unsteady: the repeats of the FSDP step")
