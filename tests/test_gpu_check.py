"""``dlo gpu-check``: the full-profile commands are valid for 1, 2, 4 and 8 GPUs before any GPU runs them, each
parser reads its records right, a crash in one benchmark does not stop the others, and the dry run (CPU,
smoke size) runs end to end."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dlo.cli import build_parser
from dlo.course import gpu_check as gc
from dlo.course.checks import load_exercises
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
                parsed = build_parser().parse_args(args)
                check_request(parsed.notebook, profile=parsed.profile, out_dir=tmp_path / "jour1")
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
            assert parsed.model == "llama-3.2-3b" and parsed.precision == "bf16"
            assert parsed.global_batch % gpus == 0


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
    assert gc.shrink(args) == ["--model", "smoke", "--precision", "bf16", "--checkpointing", "--seq-len", "32",
                               "--steps", "3"]
    assert gc.shrink(["--steps"]) == ["--steps"]  # a flag with no value after it is left alone


def test_parsers_read_their_records(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps({"final_speedup": 12.5, "final_step": "6 batch 512"}))
    assert gc._jour1_parse(tmp_path, None)[0] == 12.5
    (tmp_path / "results.json").write_text(json.dumps({"final_speedup": None, "final_sentence": "No ratio: x."}))
    value, details = gc._jour1_parse(tmp_path, None)
    assert value is None and "No ratio" in details["why"]

    recs = [{"kind": k, "implementation": i, "speedup": s}
            for k, i, s in [("mixup", "loop", 1.0), ("mixup", "batched", 80.0), ("cutmix", "loop", 1.0),
                            ("cutmix", "batched", 40.0)]]
    (tmp_path / "mix.json").write_text(json.dumps({"records": recs}))
    assert gc._mix_parse(tmp_path, None) == (40.0, {"speedup_by_kind": {"mixup": 80.0, "cutmix": 40.0}})

    fsdp = [{"rank": 1, "status": "ok", "mfu": 0.9}, {"rank": 0, "status": "ok", "mfu": 0.42, "tokens_per_s": 1}]
    assert gc._fsdp_parse(tmp_path, fsdp)[0] == pytest.approx(42.0)
    oom = gc._fsdp_parse(tmp_path, [{"rank": 0, "status": "oom", "error": "CUDA out of memory"}])
    assert oom[0] is None and "out of memory" in oom[1]["why"]

    pipe = [{"kind": "pipeline", "schedule": "1f1b", "bubble": 0.30, "bubble_theory": 0.25, "rank": 0},
            {"kind": "pipeline", "schedule": "afab", "bubble": 0.9, "bubble_theory": 0.25, "rank": 0}]
    assert gc._pipeline_parse(tmp_path, pipe)[0] == pytest.approx(20.0)

    tp = [{"kind": "layout", "impl": "scratch", "step_s_median": 0.10, "rank": 0},
          {"kind": "layout", "impl": "dtensor", "step_s_median": 0.08, "rank": 0},
          {"kind": "layout", "impl": "scratch", "step_s_median": 9.0, "rank": 1}]
    assert gc._tp_parse(tmp_path, tp)[0] == pytest.approx(0.8)

    grid = [{"rank": r, "dp": 2, "pp": 2, "tp": 2, "step_s": 0.1 * (r + 1), "comm_matches_theory": True,
             "diff": {"grad": 1e-6 * r, "after": 2e-6}} for r in range(8)]
    value, details = gc._grid_parse(tmp_path, grid)
    assert value == pytest.approx(7e-6) and details["step_s"] == pytest.approx(0.8)
    grid[3]["comm_matches_theory"] = False
    value, details = gc._grid_parse(tmp_path, grid)
    assert value == float("inf") and "rank(s) [3]" in details["why"]
    assert gc._grid_parse(tmp_path, [{k: v for k, v in grid[0].items() if k != "diff"}])[0] is None

    race_out = {"target": 0.94, "records": [{"data": "real CIFAR-10", "reached": True, "time_to_target_s": 9.0},
                                            {"data": "real CIFAR-10", "reached": False, "time_to_target_s": None}]}
    (tmp_path / "race.json").write_text(json.dumps(race_out))
    assert gc._race_parse(tmp_path, None)[0] == pytest.approx(9.0 / gc.AIRBENCH94_A100_S)
    race_out["records"][0]["data"] = "generated"
    (tmp_path / "race.json").write_text(json.dumps(race_out))
    assert gc._race_parse(tmp_path, None)[0] is None


@pytest.mark.parametrize("name, value, verdict", [("mixcutmix", 50.0, "met"), ("mixcutmix", 49.9, "MISSED"),
                                                  ("pipeline_1f1b", 15.0, "met"), ("pipeline_1f1b", 15.1, "MISSED"),
                                                  ("race", 2.9, "met"), ("race", 3.5, "MISSED")])
def test_targets_are_judged_in_their_direction(name, value, verdict):
    assert gc.verdict(BY_NAME[name], value, {}, dry=False) == verdict
    assert gc.verdict(BY_NAME[name], value, {}, dry=True) == "dry run: not judged"
    assert gc.verdict(BY_NAME[name], None, {"why": "not steady"}, dry=False) == "no value: not steady"


def test_one_crash_does_not_stop_the_others_and_small_nodes_skip(monkeypatch, tmp_path):
    calls = []

    def fake_run(bench, gpus, dry, out):
        calls.append(bench.name)
        if bench.name == "mixcutmix":
            raise LaunchError("rank 0 failed with exit code 1: CUDA error: an illegal memory access")
        if bench.name == "fsdp_mfu":
            return [{"rank": 0, "status": "ok", "mfu": 0.45}]
        raise RuntimeError("exit code 2: error: something")

    monkeypatch.setattr(gc, "_run_one", fake_run)
    payload = gc.run_checks(gpus=1, out_path=tmp_path / "r.json", log=lambda s: None)
    rows = {r["benchmark"]: r for r in payload["results"]}
    assert calls == ["jour1_ladder", "mixcutmix", "fsdp_mfu", "race"]  # the 2-GPU ones are not started
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


def test_dry_run_end_to_end_on_cpu(tmp_path):
    """The real commands at smoke size on 2 gloo processes (Jour 1's smoke profile is run by nbval in CI)."""
    out = tmp_path / "dry.json"
    done = subprocess.run([sys.executable, "-m", "dlo", "gpu-check", "--dry-run", "--skip", "jour1_ladder",
                           "--out", str(out)], capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = {r["benchmark"]: r for r in json.loads(out.read_text())["results"]}
    assert set(rows) == set(BY_NAME) - {"jour1_ladder"}
    for name in ("mixcutmix", "pipeline_1f1b", "tp_vs_dtensor"):
        assert rows[name]["verdict"] == "dry run: not judged" and rows[name]["value"] > 0, rows[name]
    assert rows["fsdp_mfu"]["details"]["status"] == "ok", rows["fsdp_mfu"]
    assert rows["race"]["details"]["data"] == "generated", rows["race"]
    assert "dry run: not judged" in done.stdout and "wrote" in done.stdout
