"""``dlo gpu-check``: every full-profile benchmark of the workbook in one go, judged against its target.

On a GPU node, ``PYTHONPATH=lib python -m dlo gpu-check`` (or ``make gpu-check``) runs, one after the other:

=================  ==================================================================  ================
benchmark          what is measured                                                    target
=================  ==================================================================  ================
``jour1_ladder``   Jour 1's optimisation ladder: final configuration vs fp32 baseline  >= 10x
``mixcutmix``      batched MixUp / CutMix against the per-sample loop (slowest kind)   >= 50x
``fsdp_mfu``       FSDP2 on Llama 3.2 3B, bf16: model FLOPs utilisation                >= 40 %
``pipeline_1f1b``  1F1B bubble, relative gap to the theory (p-1)/(m+p-1)               <= 15 %
``tp_vs_dtensor``  from-scratch tensor parallelism: DTensor's step time / ours         >= 0.9
``race``           the race's reference recipe to 94 % on real CIFAR-10, vs airbench94  <= 3x 3.83 s
=================  ==================================================================  ================

Each benchmark is a plain ``python -m dlo ...`` command or a course script started on one process per GPU
(:func:`dlo.runtime.launch.launch`), needing only torch, torchvision and transformers. One that crashes is
reported in one line and the others still run. The results go to ``results/gpu-check-<gpu>-<date>.json``
(commit it), and one table says, per benchmark, the measured value, the target and the verdict.

``--dry-run`` runs the same commands on the CPU, scaled down: the multi-process benchmarks run the command a
2-GPU node would run -- its precision, activation checkpointing, schedule, layout and micro-batch count --
with only the sizes in :data:`DRY_SIZES` shrunk, on 2 gloo processes; the notebook and the single-process
benchmarks run at smoke size. Every command line, code path, record and parser is exercised, the targets are
not judged (a CPU says nothing about them), and the file goes to ``runs/gpu-check/`` instead of
``results/``. CI runs it.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from dlo.measure.bench import environment_info
from dlo.runtime.atomic import atomic_write_text
from dlo.runtime.errors import first_line
from dlo.runtime.launch import LaunchError, launch
from dlo.runtime.paths import ROOT, run_dir

#: airbench94's time to 94 % on one A100 (Jordan, arXiv 2404.00498): the race's yardstick.
AIRBENCH94_A100_S = 3.83


@dataclasses.dataclass(frozen=True)
class Target:
    """``metric`` compared with ``threshold`` by ``op`` (">=" or "<="), in ``unit``; ``source``: why this target."""

    metric: str
    op: str
    threshold: float
    unit: str
    source: str

    def met(self, value: float) -> bool:
        return value >= self.threshold if self.op == ">=" else value <= self.threshold

    def text(self) -> str:
        return f"{self.op} {self.threshold:g}{self.unit}"


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """One benchmark: ``command(gpus, dry, out)`` gives what to run, ``parse(out, outputs)`` its measured value.

    A command is ``("module", [args of python -m dlo])`` or ``("launch", script, [args], nproc)``;
    ``parse`` returns ``(value, details)``, value None with a reason in ``details["why"]`` when there is
    no number to judge (e.g. a measurement that was not steady).
    """

    name: str
    what: str
    target: Target
    min_gpus: int
    command: Callable[[int, bool, Path], tuple]
    parse: Callable[[Path, Any], tuple[float | None, dict[str, Any]]]
    timeout_s: float = 3600.0
    ok_exit_codes: tuple[int, ...] = (0,)


# --------------------------------------------------------------------------------------------------
# The benchmarks: command and parser of each
# --------------------------------------------------------------------------------------------------

#: The GPUs a dry run pretends to have (one gloo process each).
DRY_GPUS = 2
#: What a dry run changes in a full-profile command line: sizes only (model, widths, sequence, steps).
DRY_SIZES = {"--model": "smoke", "--hidden": "32", "--intermediate": "64", "--heads": "4", "--kv-heads": "2",
             "--vocab": "64", "--seq": "16", "--seq-len": "32", "--steps": "3", "--warmup-steps": "1",
             "--warmup": "1"}


def shrink(args: list[str], sizes: Mapping[str, str] = DRY_SIZES) -> list[str]:
    """``args`` with the value after each flag of ``sizes`` replaced (every other flag and value kept)."""
    out = list(args)
    for i, arg in enumerate(out[:-1]):
        if arg in sizes:
            out[i + 1] = sizes[arg]
    return out


def _scaled(script: str, full_args: Callable[[int], list[str]], gpus: int, dry: bool) -> tuple:
    """The launch of ``script`` with the full profile's arguments for ``gpus`` GPUs, or (dry) for
    :data:`DRY_GPUS` of them, sizes shrunk."""
    if dry:
        return ("launch", script, shrink(full_args(DRY_GPUS)), DRY_GPUS)
    return ("launch", script, full_args(gpus), gpus)

def _jour1_command(gpus: int, dry: bool, out: Path) -> tuple:
    return ("module", ["run", "Jour1/jour1.ipynb", "--engine", "plain", "--profile", "smoke" if dry else "full",
                       "--out-dir", str(out)])


def _jour1_parse(out: Path, _outputs: Any) -> tuple[float | None, dict[str, Any]]:
    results = json.loads((out / "results.json").read_text())
    details = {"final_step": results.get("final_step"), "sentence": results.get("final_sentence")}
    if results.get("final_speedup") is None:
        details["why"] = "no speed-up reported: " + (results.get("final_sentence") or "not steady")
    return results.get("final_speedup"), details


def _mix_command(gpus: int, dry: bool, out: Path) -> tuple:
    size = ["--device", "cpu", "--batch-size", "16", "--repeats", "3"] if dry else ["--device", "cuda"]
    return ("module", ["mix-bench", *size, "--out", str(out / "mix.json")])


def _mix_parse(out: Path, _outputs: Any) -> tuple[float | None, dict[str, Any]]:
    records = json.loads((out / "mix.json").read_text())["records"]
    speedups = {r["kind"]: r["speedup"] for r in records if r["implementation"] != "loop"}
    if not speedups:
        return None, {"why": "no batched record in mix.json"}
    return min(speedups.values()), {"speedup_by_kind": speedups}


def _fsdp_args(gpus: int) -> list[str]:
    return ["--model", "llama-3.2-3b", "--precision", "bf16", "--checkpointing", "--seq-len", "2048",
            "--global-batch", str(2 * gpus), "--steps", "12", "--warmup-steps", "4"]


def _fsdp_command(gpus: int, dry: bool, out: Path) -> tuple:
    return _scaled("tp_fsdp/fsdp_train.py", _fsdp_args, gpus, dry)


def _fsdp_parse(out: Path, records: Any) -> tuple[float | None, dict[str, Any]]:
    mine = [r for r in records or [] if r.get("rank") == 0 and "status" in r]
    if not mine:
        return None, {"why": "the FSDP run wrote no record"}
    rec = mine[-1]
    details = {k: rec.get(k) for k in ("status", "tokens_per_s", "peak_memory_gb", "mfu", "error")}
    if rec.get("status") != "ok":
        return None, {**details, "why": f"status {rec.get('status')}: {rec.get('error')}"}
    if rec.get("mfu") is None:
        return None, {**details, "why": "no MFU: no peak FLOP/s known for this device"}
    return 100 * rec["mfu"], details


def _pipeline_args(gpus: int) -> list[str]:
    return ["--layers", str(4 * gpus), "--hidden", "2048", "--heads", "16", "--vocab", "32000", "--seq", "1024",
            "--batch", str(8 * gpus), "--micro-batches", str(4 * gpus), "--schedules", "1f1b", "--steps", "10",
            "--warmup-steps", "3"]


def _pipeline_command(gpus: int, dry: bool, out: Path) -> tuple:
    return _scaled("tp_pipeline/pipeline_train.py", _pipeline_args, gpus, dry)


def _pipeline_parse(out: Path, records: Any) -> tuple[float | None, dict[str, Any]]:
    runs = [r for r in records or [] if r.get("kind") == "pipeline" and r.get("schedule") == "1f1b"
            and r.get("bubble") is not None]
    if not runs:
        return None, {"why": "no measured 1F1B step in the records"}
    rec = runs[-1]
    gap = abs(rec["bubble"] - rec["bubble_theory"]) / rec["bubble_theory"]
    return 100 * gap, {k: rec.get(k) for k in ("stages", "micro_batches", "bubble", "bubble_theory", "step_s")}


def _tp_args(gpus: int) -> list[str]:
    return ["--layouts", f"{gpus}x1", "--impls", "scratch", "dtensor", "--vocab", "32000", "--hidden", "4096",
            "--intermediate", "11008", "--layers", "4", "--heads", "32", "--kv-heads", "8", "--seq", "1024",
            "--global-batch", "8", "--steps", "20", "--warmup", "5", "--dtype", "bfloat16"]


def _tp_command(gpus: int, dry: bool, out: Path) -> tuple:
    return _scaled("tp_tensor_parallel/tp_balises.py", _tp_args, gpus, dry)


def _tp_parse(out: Path, records: Any) -> tuple[float | None, dict[str, Any]]:
    step = {r["impl"]: r["step_s_median"] for r in records or []
            if r.get("kind") == "layout" and r.get("rank") == 0 and "step_s_median" in r}
    if not {"scratch", "dtensor"} <= set(step):
        return None, {"why": f"need both implementations' step times, got {sorted(step)}"}
    return step["dtensor"] / step["scratch"], {"step_s_median": step}


def _grid_layout(gpus: int) -> dict[str, int]:
    """The capstone's layout on ``gpus`` GPUs: tp = 2 inside a pair, pp = 2 from 4 GPUs on, dp = the rest."""
    tp = 2 if gpus >= 2 else 1
    pp = 2 if gpus >= 4 else 1
    return {"dp": max(1, gpus // (tp * pp)), "pp": pp, "tp": tp}


def _grid_args(gpus: int) -> list[str]:
    lay = _grid_layout(gpus)
    micro = 4 * lay["pp"]
    return ["--dp", str(lay["dp"]), "--pp", str(lay["pp"]), "--tp", str(lay["tp"]), "--schedules", "1f1b",
            "--micro-batches", str(micro), "--batch", str(2 * micro * lay["dp"]), "--layers", "8", "--hidden", "1024",
            "--heads", "16", "--kv-heads", "8", "--intermediate", "2816", "--vocab", "32000", "--seq", "512",
            "--steps", "10", "--warmup-steps", "3", "--compare"]


def _grid_command(gpus: int, dry: bool, out: Path) -> tuple:
    usable = 4 * (gpus // 4) if gpus >= 4 else gpus  # whole pp x tp blocks
    return _scaled("tp_pipeline/grid_train.py", _grid_args, usable, dry)


def _grid_parse(out: Path, records: Any) -> tuple[float | None, dict[str, Any]]:
    recs = [r for r in records or [] if "comm_matches_theory" in r]
    if not recs:
        return None, {"why": "no capstone record"}
    details = {"layout": {k: recs[0].get(k) for k in ("dp", "pp", "tp")}, "step_s": max(r["step_s"] for r in recs),
               "comm_matches_theory": all(r["comm_matches_theory"] for r in recs)}
    diffs = [max(r["diff"]["grad"], r["diff"]["after"]) for r in recs if r.get("diff")]
    if not diffs:
        return None, {**details, "why": "no comparison with one process in the records"}
    if not details["comm_matches_theory"]:
        bad = [r["rank"] for r in recs if not r["comm_matches_theory"]]
        return float("inf"), {**details, "why": f"communication differs from comm_theory on rank(s) {bad}"}
    return max(diffs), details


def _race_command(gpus: int, dry: bool, out: Path) -> tuple:
    if dry:  # the reference recipe's smoke version (no cuDNN, no compile), one epoch of generated data
        args = ["--recipe", "smoke", "--generated", "--set", "epochs=1"]
    else:
        args = ["--recipe", "reference", "--target", "0.94"]
    return ("module", ["race", *args, "--no-progress", "--out", str(out / "race.json")])


def _race_parse(out: Path, _outputs: Any) -> tuple[float | None, dict[str, Any]]:
    result = json.loads((out / "race.json").read_text())
    records = result.get("records") or []
    details = {"data": records[0].get("data") if records else None, "target": result.get("target")}
    times = [r["time_to_target_s"] for r in records if r.get("reached")]
    if records and records[0].get("data") != "real CIFAR-10":
        return None, {**details, "why": "not the real CIFAR-10 (set DLO_DATA_DIR): times are not comparable"}
    if not times:
        return None, {**details, "why": "the target was not reached"}
    return min(times) / AIRBENCH94_A100_S, {**details, "time_to_target_s": min(times)}


BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("jour1_ladder", "Jour 1 ladder: final configuration vs the fp32 baseline",
              Target("speed-up", ">=", 10, "x", "the workbook's goal for a GPU node"), 1, _jour1_command, _jour1_parse),
    Benchmark("mixcutmix", "batched MixUp/CutMix vs the per-sample loop (slowest kind)",
              Target("speed-up", ">=", 50, "x", "a batched kernel on a GPU"), 1, _mix_command, _mix_parse),
    Benchmark("fsdp_mfu", "FSDP2 on Llama 3.2 3B, bf16, activation checkpointing",
              Target("MFU", ">=", 40, " %", "REFERENCES.md: torchtitan/Megatron report 33-48 % on H100"), 1,
              _fsdp_command, _fsdp_parse),
    Benchmark("pipeline_1f1b", "1F1B bubble: relative gap to (p-1)/(m+p-1), m = 4p",
              Target("gap", "<=", 15, " %", "equal stages on one GPU each"), 2, _pipeline_command, _pipeline_parse),
    Benchmark("tp_vs_dtensor", "tensor parallelism: DTensor's step time / from-scratch step time",
              Target("ratio", ">=", 0.9, "", "ours at most ~10 % slower than the library"), 2, _tp_command, _tp_parse),
    Benchmark("grid_3d", "PP x TP x DP capstone (1F1B, fp32): max |difference| with one process after one step",
              Target("max |diff|", "<=", 1e-4, "", "fp32 sums in another order; comm must equal comm_theory"), 2,
              _grid_command, _grid_parse),
    Benchmark("race", "reference recipe to 94 % (real CIFAR-10): time / airbench94's 3.83 s (A100)",
              Target("time ratio", "<=", 3, "x", "REFERENCES.md: airbench94, 3.83 s on one A100"), 1,
              _race_command, _race_parse, ok_exit_codes=(0, 1)),  # dlo race exits 1 when the target is missed
)


# --------------------------------------------------------------------------------------------------
# Running them
# --------------------------------------------------------------------------------------------------

def _run_one(bench: Benchmark, gpus: int, dry: bool, out: Path) -> Any:
    """Run one benchmark's command; returns what its parser reads besides files (the launch's records)."""
    command = bench.command(gpus, dry, out)
    env = {"CUDA_VISIBLE_DEVICES": ""} if dry else None  # a dry run stays on the CPU, even on a GPU node
    if command[0] == "module":
        full_env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "lib"),
                                                                           os.environ.get("PYTHONPATH")]))}
        full_env.update(env or {})
        done = subprocess.run([sys.executable, "-m", "dlo", *command[1]], cwd=ROOT, env=full_env,
                              timeout=bench.timeout_s, capture_output=True, text=True)
        if done.returncode not in bench.ok_exit_codes:
            last = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()]
            raise RuntimeError(f"exit code {done.returncode}: {last[-1] if last else 'no output'}")
        return None
    _, script, args, nproc = command
    return launch(ROOT / script, args, nproc=nproc, records_dir=out / "records", env=env,
                  timeout_s=bench.timeout_s, echo=False)


def _gpu_name() -> str:
    """The first GPU's name, for the result file's name (CUDA only; "gpu" where torch sees none)."""
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "gpu"


def verdict(bench: Benchmark, value: float | None, details: Mapping[str, Any], dry: bool) -> str:
    """The table's verdict: "met" / "MISSED", "dry run: not judged", or why there is no number."""
    if value is None:
        return f"no value: {details.get('why', 'not measured')}"
    if dry:
        return "dry run: not judged"
    return "met" if bench.target.met(value) else "MISSED"


def run_checks(*, dry_run: bool = False, only: list[str] | None = None, skip: list[str] | None = None,
               out_path: str | os.PathLike | None = None, gpus: int | None = None,
               log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the selected benchmarks; write and return ``{"environment", "dry_run", "results": [...]}``."""
    names = [b.name for b in BENCHMARKS]
    for name in [*(only or []), *(skip or [])]:
        if name not in names:
            raise ValueError(f"unknown benchmark {name!r}: choose among {', '.join(names)}")
    if gpus is None:
        gpus = torch.cuda.device_count()
    if not dry_run and gpus == 0:
        raise ValueError("no GPU is visible: run this on a GPU node, or use --dry-run to check the commands on CPU")
    gpu_name = "cpu" if dry_run else _gpu_name()
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M")
    slug = re.sub(r"[^A-Za-z0-9]+", "-", gpu_name).strip("-").lower()
    path = Path(out_path) if out_path else (run_dir("gpu-check") if dry_run else ROOT / "results") / \
        f"gpu-check-{slug}-{stamp}.json"
    results = []
    for bench in BENCHMARKS:
        if (only and bench.name not in only) or (skip and bench.name in skip):
            continue
        row: dict[str, Any] = {"benchmark": bench.name, "what": bench.what, "target": bench.target.text(),
                               "target_source": bench.target.source}
        if not dry_run and gpus < bench.min_gpus:
            row.update(value=None, verdict=f"skipped: needs {bench.min_gpus} GPUs, {gpus} visible")
        else:
            log(f"[gpu-check] {bench.name}: {bench.what} ...")
            with tempfile.TemporaryDirectory(prefix=f"gpu-check-{bench.name}-") as tmp:
                try:
                    value, details = bench.parse(Path(tmp), _run_one(bench, gpus, dry_run, Path(tmp)))
                    row.update(value=value, details=details, verdict=verdict(bench, value, details, dry_run))
                except (LaunchError, RuntimeError, OSError, ValueError, KeyError,
                        subprocess.TimeoutExpired) as exc:
                    row.update(value=None, verdict=f"failed: {first_line(exc)}")
        results.append(row)
        log(f"[gpu-check] {bench.name}: {row['verdict']}")
    device = "cuda" if torch.cuda.is_available() and not dry_run else "cpu"
    payload = {"environment": environment_info(device), "dry_run": dry_run, "gpus": gpus,
               "results": results}
    atomic_write_text(path, json.dumps(payload, indent=2, default=str) + "\n")
    payload["path"] = str(path)
    return payload


def format_table(results: list[Mapping[str, Any]]) -> str:
    """One line per benchmark: name, measured value, target, verdict."""
    lines = [f"{'benchmark':<15} {'measured':>10} {'target':>10}  verdict"]
    for r in results:
        value = "-" if r.get("value") is None else f"{r['value']:.3g}"
        lines.append(f"{r['benchmark']:<15} {value:>10} {r['target']:>10}  {r['verdict']}")
    return "\n".join(lines)
