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
from dlo.course.gpu_benchmarks import (  # noqa: F401  (the benchmarks, importable from here as before)
    AIRBENCH94_A100_S, BENCHMARKS, DRY_GPUS, DRY_SIZES, JOUR1_QUICK, QUICK_STEPS, Benchmark, Target, _fsdp_parse,
    _grid_parse, _jour1_parse, _mix_parse, _pipeline_parse, _race_parse, _tp_parse, shrink,
)
from dlo.course.notebooks import missing_packages, source_notebooks
from dlo.measure.bench import environment_info
from dlo.runtime.atomic import atomic_write_text
from dlo.runtime.errors import first_line
from dlo.runtime.launch import LaunchError, launch
from dlo.runtime.paths import ROOT, env_with_dlo, run_dir


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
        row = _benchmark_row(bench, gpus=gpus, dry_run=dry_run, quick=quick, left=deadline - time.monotonic(), log=log)
        results.append(row)
        log(f"[gpu-check] {bench.name}: {row['verdict']}")
    device = "cuda" if torch.cuda.is_available() and not dry_run else "cpu"
    payload = {"environment": environment_info(device), "dry_run": dry_run, "quick": quick, "gpus": gpus,
               "results": results}
    atomic_write_text(path, json.dumps(payload, indent=2, default=str) + "\n")
    payload["path"] = str(path)
    return payload


def _benchmark_row(bench: Benchmark, *, gpus: int, dry_run: bool, quick: bool, left: float,
                   log: Callable[[str], None]) -> dict[str, Any]:
    """Run one benchmark (or say why not: too few GPUs, unavailable here, no time left) and judge its value."""
    row: dict[str, Any] = {"benchmark": bench.name, "what": bench.what, "target": bench.target.text(),
                           "target_source": bench.target.source, "seconds": 0.0}
    why_not = bench.unavailable(dry_run)
    if not dry_run and gpus < bench.min_gpus:
        return {**row, "value": None, "verdict": f"skipped: needs {bench.min_gpus} GPUs, {gpus} visible"}
    if why_not:
        return {**row, "value": None, "verdict": f"skipped: {why_not}"}
    if left < 5:
        return {**row, "value": None, "verdict": "not run: the quick budget was spent"}
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
    return row


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
