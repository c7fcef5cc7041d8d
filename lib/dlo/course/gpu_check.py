"""``dlo gpu-check``: every full-profile benchmark of the workbook in one go, judged against its target.

On a GPU node, ``PYTHONPATH=lib python -m dlo gpu-check`` (or ``make gpu-check``) runs, one after the other:

=================  ==================================================================  ================
benchmark          what is measured                                                    target
=================  ==================================================================  ================
``jour1_ladder``   Jour 1's ladder: final configuration vs one-GPU fp32 (ladder batch)  >= 5x 
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
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from dlo.course.notebooks import missing_packages, source_notebooks
from dlo.data.cifar import find_cifar10
from dlo.measure.bench import environment_info
from dlo.runtime.atomic import atomic_write_text
from dlo.runtime.errors import first_line
from dlo.runtime.launch import LaunchError, launch
from dlo.runtime.paths import ROOT, env_with_dlo, run_dir

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
    """One benchmark: ``command(gpus, dry, out, quick)`` gives what to run, ``parse(out, outputs)`` its measured value.

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
    #: why this benchmark cannot give a value here, checked before it starts (None: it can run)
    unavailable: Callable[[bool], str | None] = lambda dry: None
    #: the cap on its time in ``--quick`` mode (it also never runs past the quick budget)
    quick_timeout_s: float = 240.0


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


#: What ``--quick`` changes in a full-profile command line on a GPU: fewer timed steps, same sizes.
QUICK_STEPS = {"--steps": "8", "--warmup-steps": "3", "--warmup": "3"}


def _scaled(script: str, full_args: Callable[[int], list[str]], gpus: int, dry: bool, quick: bool = False) -> tuple:
    """The launch of ``script`` with the full profile's arguments for ``gpus`` GPUs, or (dry) for
    :data:`DRY_GPUS` of them, sizes shrunk; ``quick``: fewer timed steps (:data:`QUICK_STEPS`)."""
    if dry:
        return ("launch", script, shrink(full_args(DRY_GPUS)), DRY_GPUS)
    return ("launch", script, shrink(full_args(gpus), QUICK_STEPS) if quick else full_args(gpus), gpus)

#: ``--quick``: Jour 1's full profile (its batch, model and data) with fewer timed calls, shorter warm-up caps and a
#: sweep of the batches where an H100 changes regime (1024: still launch-bound; 8192: the fastest measured so far).
JOUR1_QUICK = {"repeats": "7", "warmup_s": "20", "sweep": "[1024, 8192]"}


def _jour1_command(gpus: int, dry: bool, out: Path, quick: bool = False) -> tuple:
    quick_args = [a for name, value in JOUR1_QUICK.items() for a in ("-p", name, value)] if quick and not dry else []
    return ("module", ["run", "Jour1/jour1.ipynb", "--engine", "plain", "--profile", "smoke" if dry else "full",
                       "--out-dir", str(out), *quick_args])


def _jour1_parse(out: Path, _outputs: Any) -> tuple[float | None, dict[str, Any]]:
    """``final_speedup``: the final configuration over the fp32 baseline on the same device (``baseline_step``)."""
    results = json.loads((out / "results.json").read_text())
    details = {"final_step": results.get("final_step"), "sentence": results.get("final_sentence"),
               "baseline_step": results.get("baseline_step"), "final_batch_size": results.get("final_batch_size")}
    if results.get("final_speedup") is None:
        details["why"] = "no speed-up reported: " + (results.get("final_sentence") or "not steady")
    return results.get("final_speedup"), details


def _mix_command(gpus: int, dry: bool, out: Path, quick: bool = False) -> tuple:
    size = (["--device", "cpu", "--batch-size", "16", "--repeats", "3"] if dry
            else ["--device", "cuda", *(["--repeats", "10"] if quick else [])])
    return ("module", ["mix-bench", *size, "--out", str(out / "mix.json")])


def _mix_parse(out: Path, _outputs: Any) -> tuple[float | None, dict[str, Any]]:
    records = json.loads((out / "mix.json").read_text())["records"]
    speedups = {r["kind"]: r["speedup"] for r in records if r["implementation"] != "loop"}
    if not speedups:
        return None, {"why": "no batched record in mix.json"}
    return min(speedups.values()), {"speedup_by_kind": speedups}


def _fsdp_args(gpus: int) -> list[str]:
    """The levers of tp_fsdp/fsdp.ipynb together: 8 micro-batches of 2 x 2048 tokens per optimizer step (the step
    and, with several GPUs, the reduce-scatter paid once per 8), selective activation checkpointing (matmul outputs
    kept, element-wise ops recomputed), the loss chunk by chunk (no [tokens, 128k] logits at once), fused AdamW,
    each decoder layer compiled. On one GPU the gradients are reduced after every micro-batch: deferring it would
    keep the unsharded fp32 gradients (+12.9 GB; the calculator predicts 64.5 GB peak this way, 77 GB deferred)."""
    return ["--model", "llama-3.2-3b", "--precision", "bf16", "--checkpointing", "selective", "--seq-len", "2048",
            "--global-batch", str(16 * gpus), "--grad-accum", "8", "--accum-sync", "every" if gpus == 1 else "last",
            "--loss", "chunked", "--loss-chunk-tokens", "1024", "--optimizer-impl", "fused", "--compile",
            "--steps", "12", "--warmup-steps", "4"]


def _fsdp_command(gpus: int, dry: bool, out: Path, quick: bool = False) -> tuple:
    return _scaled("tp_fsdp/fsdp_train.py", _fsdp_args, gpus, dry, quick)


def _fsdp_parse(out: Path, records: Any) -> tuple[float | None, dict[str, Any]]:
    mine = [r for r in records or [] if r.get("rank") == 0 and "status" in r]
    if not mine:
        return None, {"why": "the FSDP run wrote no record"}
    rec = mine[-1]
    details = {k: rec.get(k) for k in ("status", "tokens_per_s", "peak_memory_gb", "predicted_gb", "mfu", "hfu",
                                       "sdpa_backends", "optimizer_impl_resolved", "error") if k in rec}
    if rec.get("status") != "ok":
        return None, {**details, "why": f"status {rec.get('status')}: {rec.get('error')}"}
    if rec.get("mfu") is None:
        return None, {**details, "why": "no MFU: no peak FLOP/s known for this device"}
    return 100 * rec["mfu"], details


def _pipeline_args(gpus: int) -> list[str]:
    return ["--layers", str(4 * gpus), "--hidden", "2048", "--heads", "16", "--vocab", "32000", "--seq", "1024",
            "--batch", str(8 * gpus), "--micro-batches", str(4 * gpus), "--schedules", "1f1b", "--steps", "10",
            "--warmup-steps", "3"]


def _pipeline_command(gpus: int, dry: bool, out: Path, quick: bool = False) -> tuple:
    return _scaled("tp_pipeline/pipeline_train.py", _pipeline_args, gpus, dry, quick)


def _pipeline_parse(out: Path, records: Any) -> tuple[float | None, dict[str, Any]]:
    runs = [r for r in records or [] if r.get("kind") == "pipeline" and r.get("schedule") == "1f1b"
            and r.get("bubble") is not None]
    if not runs:
        return None, {"why": "no measured 1F1B step in the records"}
    rec = runs[-1]
    details = {k: rec.get(k) for k in ("stages", "micro_batches", "bubble", "bubble_theory", "step_s")}
    theory = rec.get("bubble_theory")
    if not isinstance(theory, (int, float)) or theory <= 0:
        return None, {**details, "why": f"no bubble in theory ({theory!r}: one stage?), so no gap to it"}
    # Signed: above theory is the schedule's cost; far below it, the measurement is wrong (no schedule of equal
    # stages beats (p-1)/(m+p-1)). The value judged is the size of the gap, so neither side is "met" when far off.
    signed = 100 * (rec["bubble"] - theory) / theory
    details.update(gap_signed_pct=signed, side="above theory" if signed >= 0 else "below theory")
    if signed < -15:
        details["note"] = ("bubble far below what 1F1B allows: the timing is off (unequal stages, or a step timed "
                           "without its pipeline waits), not the schedule better")
    return abs(signed), details


def _tp_args(gpus: int) -> list[str]:
    return ["--layouts", f"{gpus}x1", "--impls", "scratch", "dtensor", "--vocab", "32000", "--hidden", "4096",
            "--intermediate", "11008", "--layers", "4", "--heads", "32", "--kv-heads", "8", "--seq", "1024",
            "--global-batch", "8", "--steps", "20", "--warmup", "5", "--dtype", "bfloat16"]


def _tp_command(gpus: int, dry: bool, out: Path, quick: bool = False) -> tuple:
    return _scaled("tp_tensor_parallel/tp_balises.py", _tp_args, gpus, dry, quick)


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


def _grid_command(gpus: int, dry: bool, out: Path, quick: bool = False) -> tuple:
    usable = 4 * (gpus // 4) if gpus >= 4 else gpus  # whole pp x tp blocks
    return _scaled("tp_pipeline/grid_train.py", _grid_args, usable, dry, quick)


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


def _race_unavailable(dry: bool) -> str | None:
    """A race time compares with airbench94 only on the real CIFAR-10: without it, say so before training."""
    if dry:
        return None
    if find_cifar10() is None:
        return "needs the real CIFAR-10 (set DLO_DATA_DIR to the folder holding cifar-10-batches-py)"
    return None


def _race_command(gpus: int, dry: bool, out: Path, quick: bool = False) -> tuple:
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
    Benchmark("jour1_ladder", "Jour 1 ladder: final configuration vs one-GPU fp32 at the ladder's batch",
              Target("speed-up", ">=", 5, "x", "H100, ResNet-18 CIFAR: bf16 + channels_last at batch 8192 alone gave "
                     "4.5x the fp32 batch-256 step (shared/gpu-measurements)"), 1, _jour1_command, _jour1_parse,
              quick_timeout_s=300.0),
    Benchmark("mixcutmix", "batched MixUp/CutMix vs the per-sample loop (slowest kind)",
              Target("speed-up", ">=", 50, "x", "a batched kernel on a GPU"), 1, _mix_command, _mix_parse),
    Benchmark("fsdp_mfu", "FSDP2 on Llama 3.2 3B, bf16, with the levers of fsdp.ipynb (accumulation, selective AC, "
              "chunked loss, fused AdamW, compile)",
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
              _race_command, _race_parse, ok_exit_codes=(0, 1),  # dlo race exits 1 when the target is missed
              unavailable=_race_unavailable),
)


# --------------------------------------------------------------------------------------------------
# Running them
# --------------------------------------------------------------------------------------------------

def _last_line(text: str) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def _run_one(bench: Benchmark, gpus: int, dry: bool, out: Path, *, quick: bool = False,
             timeout_s: float | None = None) -> Any:
    """Run one benchmark's command; returns what its parser reads besides files (the launch's records)."""
    command = bench.command(gpus, dry, out, quick)
    env = {"CUDA_VISIBLE_DEVICES": ""} if dry else None  # a dry run stays on the CPU, even on a GPU node
    timeout_s = timeout_s or bench.timeout_s
    if command[0] == "module":
        done = subprocess.run([sys.executable, "-m", "dlo", *command[1]], cwd=ROOT, env=env_with_dlo(**(env or {})),
                              timeout=timeout_s, capture_output=True, text=True)
        if done.returncode not in bench.ok_exit_codes:
            raise RuntimeError(f"exit code {done.returncode}: {_last_line(done.stderr or done.stdout)}")
        return None
    _, script, args, nproc = command
    return launch(ROOT / script, args, nproc=nproc, records_dir=out / "records", env=env,
                  timeout_s=timeout_s, echo=False)


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


# --------------------------------------------------------------------------------------------------
# --quick: every notebook's dry profile on the GPU, then the one-GPU benchmarks, in one short run
# --------------------------------------------------------------------------------------------------

#: The whole of ``--quick``, notebooks and benchmarks (a step never starts past it, nor runs beyond it).
QUICK_BUDGET_S = 450.0
#: The cap on one notebook's dry profile in ``--quick`` (on a GPU node most take 10-60 s).
NOTEBOOK_TIMEOUT_S = 180.0
_TOO_FEW_GPUS = re.compile(r"failed with TooFewGPUs: .*? launches (\d+) processes but only (\d+) GPU")


def rehearse_notebook(path: str | os.PathLike, out: Path, *, timeout_s: float = 900.0, dry: bool = False,
                      env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Run one notebook's ``dry`` profile as ``python -m dlo run NB --engine plain --profile dry`` (the plain engine:
    what a GPU node without Jupyter runs) in its own Python; on the GPU when one is visible, unless ``dry`` (then
    ``CUDA_VISIBLE_DEVICES`` is emptied). ``env``: the environment to start from (default this process's).

    Returns a row: ``notebook`` (path from the repository root), ``seconds``, ``verdict`` ("ok", "failed: <the
    error's one line>", or "skipped: <why>" for a notebook whose launches need more GPUs than visible or that imports
    a package this Python lacks, e.g. Optuna on a bare node), ``output_tail`` (its last lines, on failure) and
    ``returncode``."""
    path = Path(path).resolve()
    name = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
    row: dict[str, Any] = {"notebook": name, "seconds": 0.0}
    missing = missing_packages(path)
    if missing:
        return {**row, "verdict": f"skipped: needs {', '.join(missing)} (not installed here)"}
    extra = {"PYTHONUNBUFFERED": "1", "MPLBACKEND": "Agg", "DLO_RUNS_DIR": str(out.parent),
             **({"CUDA_VISIBLE_DEVICES": ""} if dry else {})}
    full_env = env_with_dlo(None if env is None else dict(env), **extra)
    start = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-m", "dlo", "run", str(path), "--engine", "plain", "--profile", "dry",
                               "--out-dir", str(out)], cwd=ROOT, env=full_env, capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        text = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return {**row, "seconds": round(time.monotonic() - start, 1), "returncode": None,
                "verdict": f"failed: still running after {timeout_s:.0f} s (last line: {_last_line(text)})",
                "output_tail": text.strip().splitlines()[-15:]}
    row.update(seconds=round(time.monotonic() - start, 1), returncode=done.returncode)
    text = (done.stdout or "") + (done.stderr or "")
    if done.returncode == 0:
        return {**row, "verdict": "ok"}
    error = _last_line(done.stderr or done.stdout).removeprefix("error: ")
    gpus = _TOO_FEW_GPUS.search(error)
    if gpus:
        return {**row, "verdict": f"skipped: needs {gpus.group(1)} GPUs, {gpus.group(2)} visible ({error})"}
    return {**row, "verdict": f"failed: {error}", "output_tail": text.strip().splitlines()[-15:]}


def _rehearse_all(notebooks: list[Path], *, dry: bool, jobs: int, deadline: float, work: Path,
                  log: Callable[[str], None]) -> list[dict[str, Any]]:
    """:func:`rehearse_notebook` for each notebook, ``jobs`` at a time (their timing is not judged: they may share
    the GPU), none started past ``deadline`` (time.monotonic()) nor allowed to run beyond it."""
    from concurrent.futures import ThreadPoolExecutor

    threads = max(1, (os.cpu_count() or 1) // jobs)

    def one(path: Path) -> dict[str, Any]:
        left = deadline - time.monotonic()
        name = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
        if left < 5:
            return {"notebook": name, "seconds": 0.0, "verdict": "not run: the quick budget was spent"}
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(threads))}
        row = rehearse_notebook(path, work / path.stem, timeout_s=min(NOTEBOOK_TIMEOUT_S, left), dry=dry, env=env)
        log(f"[gpu-check] {name}: {row['verdict']} ({row['seconds']:.0f} s)")
        return row

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(one, notebooks))


def run_checks(*, dry_run: bool = False, only: list[str] | None = None, skip: list[str] | None = None,
               out_path: str | os.PathLike | None = None, gpus: int | None = None, quick: bool = False,
               notebooks: list[str] | None = None, jobs: int | None = None, budget_s: float | None = None,
               log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the selected benchmarks; write and return ``{"environment", "dry_run", "quick", "results": [...]}``.

    ``quick``: first every course notebook's ``dry`` profile (or those in ``notebooks``) on the GPU through the
    plain engine, ``jobs`` at a time, then the one-GPU benchmarks with fewer timed steps, alone; all of it within
    ``budget_s`` seconds (default :data:`QUICK_BUDGET_S`; a step is capped at what is left; what cannot start is
    reported "not run"). Multi-GPU benchmarks are skipped there with what they need. The JSON then has one row per
    notebook too."""
    names = [b.name for b in BENCHMARKS]
    for name in [*(only or []), *(skip or [])]:
        if name not in names:
            raise ValueError(f"unknown benchmark {name!r}: choose among {', '.join(names)}")
    if notebooks is not None and not quick:
        raise ValueError("--notebooks goes with --quick: it picks the notebooks whose dry profile --quick runs")
    chosen: list[Path] = []
    if quick:
        chosen = [Path(nb).resolve() for nb in notebooks] if notebooks is not None else source_notebooks()
        absent = [str(nb) for nb in chosen if not nb.is_file() or nb.suffix != ".ipynb"]
        if absent:
            raise ValueError(f"no notebook at {', '.join(absent)}: give paths of .ipynb files, e.g. Jour1/jour1.ipynb")
    if gpus is None:
        gpus = torch.cuda.device_count()
    if not dry_run and gpus == 0:
        raise ValueError("no GPU is visible: run this on a GPU node, or use --dry-run to check the commands on CPU")
    if (jobs is not None or budget_s is not None) and not quick:
        raise ValueError("--jobs and --budget go with --quick")
    if jobs is not None and jobs < 1:
        raise ValueError(f"--jobs must be at least 1, got {jobs}")
    if budget_s is not None and not budget_s > 0:
        raise ValueError(f"--budget must be a positive number of seconds, got {budget_s}")
    budget_s = QUICK_BUDGET_S if budget_s is None else budget_s
    gpu_name = "cpu" if dry_run else _gpu_name()
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M")
    slug = re.sub(r"[^A-Za-z0-9]+", "-", gpu_name).strip("-").lower() + ("-quick" if quick else "")
    path = Path(out_path) if out_path else (run_dir("gpu-check") if dry_run else ROOT / "results") / \
        f"gpu-check-{slug}-{stamp}.json"
    deadline = time.monotonic() + budget_s if quick else float("inf")
    results: list[dict[str, Any]] = []
    if quick and chosen:
        jobs = jobs or max(1, min(4, (os.cpu_count() or 1) // 4))
        log(f"[gpu-check] {len(chosen)} notebooks' dry profile, {jobs} at a time, "
            f"{'on the CPU' if dry_run else 'on the GPU'} (plain engine) ...")
        with tempfile.TemporaryDirectory(prefix="gpu-check-notebooks-") as tmp:
            results += _rehearse_all(chosen, dry=dry_run, jobs=jobs, deadline=deadline, work=Path(tmp), log=log)
    for bench in BENCHMARKS:
        if (only and bench.name not in only) or (skip and bench.name in skip):
            continue
        row: dict[str, Any] = {"benchmark": bench.name, "what": bench.what, "target": bench.target.text(),
                               "target_source": bench.target.source, "seconds": 0.0}
        left = deadline - time.monotonic()
        why_not = bench.unavailable(dry_run)
        if not dry_run and gpus < bench.min_gpus:
            row.update(value=None, verdict=f"skipped: needs {bench.min_gpus} GPUs, {gpus} visible")
        elif why_not:
            row.update(value=None, verdict=f"skipped: {why_not}")
        elif left < 5:
            row.update(value=None, verdict="not run: the quick budget was spent")
        else:
            log(f"[gpu-check] {bench.name}: {bench.what} ...")
            timeout_s = min(bench.quick_timeout_s, left) if quick else bench.timeout_s
            start = time.monotonic()
            with tempfile.TemporaryDirectory(prefix=f"gpu-check-{bench.name}-") as tmp:
                try:
                    value, details = bench.parse(Path(tmp), _run_one(bench, gpus, dry_run, Path(tmp), quick=quick,
                                                                     timeout_s=timeout_s))
                    row.update(value=value, details=details, verdict=verdict(bench, value, details, dry_run))
                except subprocess.TimeoutExpired:
                    row.update(value=None, verdict=f"failed: still running after {timeout_s:.0f} s")
                except (LaunchError, RuntimeError, OSError, ValueError, KeyError) as exc:
                    row.update(value=None, verdict=f"failed: {first_line(exc)}")
            row["seconds"] = round(time.monotonic() - start, 1)
        results.append(row)
        log(f"[gpu-check] {bench.name}: {row['verdict']}")
    device = "cuda" if torch.cuda.is_available() and not dry_run else "cpu"
    payload = {"environment": environment_info(device), "dry_run": dry_run, "quick": quick, "gpus": gpus,
               "results": results}
    atomic_write_text(path, json.dumps(payload, indent=2, default=str) + "\n")
    payload["path"] = str(path)
    return payload


def failed(results: list[Mapping[str, Any]]) -> list[str]:
    """The names of the rows that failed (a crash, a timeout): what makes ``dlo gpu-check`` exit 1."""
    return [r.get("benchmark") or r.get("notebook") for r in results if str(r["verdict"]).startswith("failed")]


def format_table(results: list[Mapping[str, Any]]) -> str:
    """One line per notebook or benchmark: name, seconds, measured value, target, verdict."""
    width = max([15, *(len(str(r.get("benchmark") or r.get("notebook"))) for r in results)])
    lines = [f"{'notebook or benchmark':<{width}} {'seconds':>7} {'measured':>10} {'target':>10}  verdict"]
    for r in results:
        value = "-" if r.get("value") is None else f"{r['value']:.3g}"
        name = r.get("benchmark") or r.get("notebook")
        lines.append(f"{name:<{width}} {r.get('seconds', 0.0):>7.0f} {value:>10} {r.get('target', '-'):>10}  "
                     f"{r['verdict']}")
    return "\n".join(lines)
