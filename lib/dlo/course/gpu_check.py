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
(:func:`dlo.runtime.launch.launch`), needing only torch, torchvision and transformers, each run in a session of its
own: at its cap the whole of it (torchrun, the ranks, whatever they started) is killed, and nothing of it is left
before the next step starts (:mod:`dlo.runtime.process_tree`). One that crashes is reported in one line
("failed: ...") and the others still run; one stopped by its cap reads "timed out after N s", one not started for
lack of time "not run: N s left, it needs M s", one whose results hold no finite number "invalid: <field> is
<value>": none of these is a failure, and only failures make the exit code 1.

``--quick`` (:mod:`dlo.course.gpu_budget`) spends short GPU time on the targets first: ``fsdp_mfu``, then
``jour1_ladder``, then ``mixcutmix``, each under its own cap, then the notebooks' dry profiles in what is left. The results go to ``results/gpu-check-<gpu>-<date>.json``
(commit it), and one table says, per benchmark, the measured value, the target and the verdict.

``--dry-run`` runs the same commands on the CPU, scaled down: the multi-process benchmarks run the command a
2-GPU node would run -- its precision, activation checkpointing, schedule, layout and micro-batch count --
with only the sizes in :data:`DRY_SIZES` shrunk, on 2 gloo processes; the notebook and the single-process
benchmarks run at smoke size. Every command line, code path, record and parser is exercised, the targets are
not judged (a CPU says nothing about them: the table's first line and the JSON's ``title`` say DRY RUN), and the
file goes to ``runs/gpu-check/`` instead of ``results/``; ``--quick --dry-run`` uses caps sized for a small CPU. CI
runs it.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from dlo.course import gpu_budget
from dlo.course.gpu_benchmarks import BENCHMARKS, DRY_GPUS, DRY_SIZES, Benchmark, fsdp_plan
from dlo.course.checks.framework import SKIP_ENV as SKIP_CHECKS_ENV
from dlo.course.gpu_budget import QUICK_BUDGET_S, QUICK_ORDER
from dlo.course.notebooks import missing_packages, source_notebooks
from dlo.measure.records import environment_info
from dlo.runtime.atomic import atomic_write_text
from dlo.runtime.errors import first_line
from dlo.runtime.paths import ROOT, env_with_dlo, run_dir
from dlo.runtime.process_tree import run_capped
from dlo.runtime.records import read_records


# --------------------------------------------------------------------------------------------------
# Running them: every step in a session of its own, stopped whole at its cap
# --------------------------------------------------------------------------------------------------

class StepTimedOut(Exception):
    """A step stopped by its cap (or by what was left of the budget): not a failure, the row says so."""

    def __init__(self, cap_s: float, last_line: str) -> None:
        super().__init__(gpu_budget.timed_out(cap_s))
        self.cap_s, self.last_line = cap_s, last_line


#: A benchmark's launch, run in a Python of its own: at the cap, it and everything it launched (torchrun, the ranks,
#: a fork server) are killed together (:func:`dlo.runtime.process_tree.run_capped`).
_LAUNCH_STEP = """
import json, sys
from dlo.runtime.errors import first_line
from dlo.runtime.launch import LaunchError, launch
spec = json.loads(sys.argv[1])
try:
    launch(spec["script"], spec["args"], nproc=spec["nproc"], records_dir=spec["records"], echo=False)
except (LaunchError, ValueError, RuntimeError) as exc:
    print(first_line(exc), file=sys.stderr)
    sys.exit(1)
"""


def _last_line(text: str) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def _run_one(bench: Benchmark, gpus: int, dry: bool, out: Path, *, quick: bool = False,
             timeout_s: float | None = None) -> Any:
    """Run one benchmark's command in a session of its own, for at most ``timeout_s`` (default its own); returns
    what its parser reads besides files (a launch's records). StepTimedOut at the cap; RuntimeError on a crash."""
    command = bench.command(gpus, dry, out, quick)
    env = env_with_dlo(**({"CUDA_VISIBLE_DEVICES": ""} if dry else {}))  # a dry run stays on the CPU
    timeout_s = timeout_s or bench.timeout_s
    if command[0] == "module":
        argv, ok = [sys.executable, "-m", "dlo", *command[1]], bench.ok_exit_codes
    else:
        _, script, args, nproc = command
        spec = {"script": str(ROOT / script), "args": list(args), "nproc": nproc, "records": str(out / "records")}
        argv, ok = [sys.executable, "-c", _LAUNCH_STEP, json.dumps(spec)], (0,)
    done = run_capped(argv, timeout_s=timeout_s, cwd=ROOT, env=env)
    if done.timed_out:
        raise StepTimedOut(timeout_s, _last_line(done.stdout + done.stderr))
    if done.returncode not in ok:
        error = _last_line(done.stderr or done.stdout)
        raise RuntimeError(error if command[0] == "launch" else f"exit code {done.returncode}: {error}")
    return read_records(out / "records") if command[0] == "launch" else None


def _gpu_name() -> str:
    """The first GPU's name, for the result file's name (CUDA only; "gpu" where torch sees none)."""
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "gpu"


def verdict(bench: Benchmark, value: float | None, details: Mapping[str, Any], dry: bool) -> str:
    """The table's verdict: "met" / "MISSED", "dry run: not judged", or why there is no number."""
    if value is None:
        return f"no value: {details.get('why', 'not measured')}"
    if dry:
        return "dry run: not judged"
    if details.get("missed"):
        return f"MISSED: {details['missed']}"
    return "met" if bench.target.met(value) else "MISSED"


def _not_a_number(value: Any) -> str | None:
    """How a parsed value that is not a finite number reads (one line, short), or None when it is one (or None)."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return None
    text = " ".join(repr(value).split())
    return text if len(text) <= 60 else text[:57] + "..."


def _judge(bench: Benchmark, out: Path, outputs: Any, dry: bool) -> dict[str, Any]:
    """Read and judge a benchmark's output. A results file of the wrong shape (a string, NaN or inf where a number
    is expected, a field missing) is one "invalid: ..." row, never "met"/"MISSED" and never an exception."""
    try:
        value, details = bench.parse(out, outputs)
    except OSError as exc:
        return {"value": None, "verdict": f"failed: {first_line(exc)}"}
    except Exception as exc:  # noqa: BLE001 - whatever the file holds, the table is written
        return {"value": None, "verdict": f"invalid: {bench.field} could not be read ({type(exc).__name__}: "
                                          f"{first_line(exc)})"}
    bad = _not_a_number(value)
    if bad is not None:
        return {"value": None, "details": details, "verdict": f"invalid: {bench.field} is {bad}"}
    return {"value": value, "details": details, "verdict": verdict(bench, value, details, dry)}


# --------------------------------------------------------------------------------------------------
# --quick: the one-GPU target benchmarks first, each under its cap, then the notebooks' dry profiles
# --------------------------------------------------------------------------------------------------

#: The caps on a GPU (dlo.course.gpu_budget), under their former names.
NOTEBOOK_TIMEOUT_S = gpu_budget.NOTEBOOK_CAP_S
_TOO_FEW_GPUS = re.compile(r"failed with TooFewGPUs: .*? launches (\d+) processes but only (\d+) GPU")


def rehearse_notebook(path: str | os.PathLike, out: Path, *, timeout_s: float = 900.0, dry: bool = False,
                      env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Run one notebook's ``dry`` profile as ``python -m dlo run NB --engine plain --profile dry`` (the plain engine:
    what a GPU node without Jupyter runs) in its own Python and session, for at most ``timeout_s``; on the GPU when
    one is visible, unless ``dry`` (then ``CUDA_VISIBLE_DEVICES`` is emptied). ``env``: the environment to start
    from (default this process's). The exercise checks are not run again (``DLO_SKIP_CHECKS=1``, see
    :data:`dlo.course.checks.framework.SKIP_ENV`): they do not depend on the profile, and the smoke runs run them.

    Returns a row: ``notebook`` (path from the repository root), ``seconds``, ``verdict`` ("ok", "failed: <the
    error's one line>", "timed out after N s", or "skipped: <why>" for a notebook whose launches need more GPUs than
    visible or that imports a package this Python lacks, e.g. Optuna on a bare node), ``output_tail`` (its last
    lines, on failure or timeout) and ``returncode``."""
    path = Path(path).resolve()
    name = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
    row: dict[str, Any] = {"notebook": name, "seconds": 0.0}
    missing = missing_packages(path)
    if missing:
        return {**row, "verdict": f"skipped: needs {', '.join(missing)} (not installed here)"}
    extra = {"PYTHONUNBUFFERED": "1", "MPLBACKEND": "Agg", "DLO_RUNS_DIR": str(out.parent), SKIP_CHECKS_ENV: "1",
             **({"CUDA_VISIBLE_DEVICES": ""} if dry else {})}
    full_env = env_with_dlo(None if env is None else dict(env), **extra)
    done = run_capped([sys.executable, "-m", "dlo", "run", str(path), "--engine", "plain", "--profile", "dry",
                       "--out-dir", str(out)], timeout_s=timeout_s, cwd=ROOT, env=full_env)
    row.update(seconds=round(done.seconds, 1), returncode=done.returncode)
    text = done.stdout + done.stderr
    if done.timed_out:
        return {**row, "verdict": gpu_budget.timed_out(timeout_s), "last_line": _last_line(text),
                "output_tail": text.strip().splitlines()[-15:]}
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
    the GPU), each under its cap and never beyond ``deadline`` (time.monotonic()); one that would start with less
    left than a notebook needs is not started, and its row says so."""
    from concurrent.futures import ThreadPoolExecutor

    _, _, cap_s, need_s, _ = gpu_budget.caps(dry)
    threads = max(1, (os.cpu_count() or 1) // jobs)

    def one(path: Path) -> dict[str, Any]:
        left = deadline - time.monotonic()
        name = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
        if left < need_s:
            return {"notebook": name, "seconds": 0.0, "verdict": gpu_budget.not_run(left, need_s)}
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(threads))}
        row = rehearse_notebook(path, work / path.stem, timeout_s=min(cap_s, left), dry=dry, env=env)
        log(f"[gpu-check] {name}: {row['verdict']} ({row['seconds']:.0f} s)")
        return row

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(one, notebooks))


def _check_request(*, dry_run: bool, only: list[str] | None, skip: list[str] | None, quick: bool,
                   notebooks: list[str] | None, jobs: int | None, budget_s: float | None, gpus: int) -> list[Path]:
    """Every argument checked before anything runs (one line each); returns the notebooks ``--quick`` rehearses."""
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
    if not dry_run and gpus == 0:
        raise ValueError("no GPU is visible: run this on a GPU node, or use --dry-run to check the commands on CPU")
    if (jobs is not None or budget_s is not None) and not quick:
        raise ValueError("--jobs and --budget go with --quick")
    if jobs is not None and jobs < 1:
        raise ValueError(f"--jobs must be at least 1, got {jobs}")
    if budget_s is not None and not budget_s > 0:
        raise ValueError(f"--budget must be a positive number of seconds, got {budget_s}")
    return chosen


def _ordered(quick: bool) -> list[Benchmark]:
    """The benchmarks in the order they run: ``--quick``'s (:data:`QUICK_ORDER`, the one-GPU targets first)."""
    if not quick:
        return list(BENCHMARKS)
    rank = {name: i for i, name in enumerate(QUICK_ORDER)}
    return sorted(BENCHMARKS, key=lambda b: rank.get(b.name, len(rank)))


def title(dry_run: bool, quick: bool, budget_s: float | None = None) -> str:
    """The table's first line (also in the JSON): what kind of run this was."""
    kind = "quick acceptance run" + (f", {budget_s:.0f} s budget" if budget_s else "") if quick else "full benchmarks"
    if dry_run:
        return f"DRY RUN (targets not judged): gpu-check {kind}, the commands checked on the CPU at smoke size"
    return f"gpu-check {kind}: measured values judged against their targets"


def run_checks(*, dry_run: bool = False, only: list[str] | None = None, skip: list[str] | None = None,
               out_path: str | os.PathLike | None = None, gpus: int | None = None, quick: bool = False,
               notebooks: list[str] | None = None, jobs: int | None = None, budget_s: float | None = None,
               log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the selected benchmarks; write and return ``{"title", "environment", "dry_run", "quick", "results"}``.

    ``quick``: the benchmarks first, one-GPU targets in :data:`QUICK_ORDER`, each under its cap
    (:mod:`dlo.course.gpu_budget`), then every course notebook's ``dry`` profile (or those in ``notebooks``) through
    the plain engine, ``jobs`` at a time, in what is left of ``budget_s`` seconds (default
    :data:`QUICK_BUDGET_S`, on a CPU ``gpu_budget.DRY_BUDGET_S``): a step is never allowed more than the budget
    left, and one that needs more than is left is reported "not run" with both figures. The JSON then has one row
    per notebook too."""
    gpus = torch.cuda.device_count() if gpus is None else gpus
    chosen = _check_request(dry_run=dry_run, only=only, skip=skip, quick=quick, notebooks=notebooks, jobs=jobs,
                            budget_s=budget_s, gpus=gpus)
    caps, needs, _, _, default_budget = gpu_budget.caps(dry_run)
    budget_s = (default_budget if budget_s is None else budget_s) if quick else None
    gpu_name = "cpu" if dry_run else _gpu_name()
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M")
    slug = re.sub(r"[^A-Za-z0-9]+", "-", gpu_name).strip("-").lower() + ("-quick" if quick else "")
    path = Path(out_path) if out_path else (run_dir("gpu-check") if dry_run else ROOT / "results") / \
        f"gpu-check-{slug}-{stamp}.json"
    deadline = time.monotonic() + budget_s if quick else float("inf")
    log(f"[gpu-check] {title(dry_run, quick, budget_s)}")
    results: list[dict[str, Any]] = []
    for bench in _ordered(quick):
        if (only and bench.name not in only) or (skip and bench.name in skip):
            continue
        try:
            row = _benchmark_row(bench, gpus=gpus, dry_run=dry_run, quick=quick, left=deadline - time.monotonic(),
                                 cap=caps.get(bench.name, 60.0), need=needs.get(bench.name, 10.0), log=log)
        except Exception as exc:  # noqa: BLE001 - one benchmark's surprise never loses the others' rows
            row = {"benchmark": bench.name, "seconds": 0.0, "value": None,
                   "verdict": f"failed: {type(exc).__name__}: {first_line(exc)}"}
        results.append(row)
        log(f"[gpu-check] {bench.name}: {row['verdict']}")
    if quick and chosen:
        jobs = jobs or max(1, min(4, (os.cpu_count() or 1) // 4))
        log(f"[gpu-check] {len(chosen)} notebooks' dry profile, {jobs} at a time, "
            f"{'on the CPU' if dry_run else 'on the GPU'} (plain engine), in the {deadline - time.monotonic():.0f} s "
            "left ...")
        with tempfile.TemporaryDirectory(prefix="gpu-check-notebooks-") as tmp:
            results += _rehearse_all(chosen, dry=dry_run, jobs=jobs, deadline=deadline, work=Path(tmp), log=log)
    device = "cuda" if torch.cuda.is_available() and not dry_run else "cpu"
    payload = {"title": title(dry_run, quick, budget_s), "environment": environment_info(device), "dry_run": dry_run,
               "quick": quick, "gpus": gpus, "budget_s": budget_s, "results": results}
    atomic_write_text(path, json.dumps(payload, indent=2, default=str) + "\n")
    payload["path"] = str(path)
    return payload


def _fsdp_plan_line(gpus: int, dry_run: bool) -> tuple[dict[str, Any], str]:
    """The FSDP benchmark's configuration for this node (a dry run: the 80 GB one its command is shrunk from)."""
    plan = fsdp_plan(DRY_GPUS if dry_run else gpus)
    return plan, (f"sized to {plan['device_gb']:.0f} GB per GPU: --micro-batch {plan['micro_batch']} x 2048 "
                  f"--grad-accum {plan['grad_accum']} --accum-sync {plan['accum_sync']} --checkpointing "
                  f"{plan['checkpointing']}: predicted peak {plan['predicted_gb']:.1f} GB (under "
                  f"{plan['limit_gb']:.1f} GB: the device less the CUDA context and a {plan['margin']:.0%} margin)")


def _benchmark_row(bench: Benchmark, *, gpus: int, dry_run: bool, quick: bool, left: float, log: Callable[[str], None],
                   cap: float = 240.0, need: float = 5.0) -> dict[str, Any]:
    """Run one benchmark (or say why not: too few GPUs, unavailable here, not in --quick, not enough time left) and
    judge its value. In ``quick``, it runs for at most ``cap`` seconds and never beyond ``left``, and is not started
    with less than ``need`` left."""
    row: dict[str, Any] = {"benchmark": bench.name, "what": bench.what, "target": bench.target.text(),
                           "target_source": bench.target.source, "seconds": 0.0}
    why_not = bench.unavailable(dry_run)
    if not dry_run and gpus < bench.min_gpus:
        return {**row, "value": None, "verdict": f"skipped: needs {bench.min_gpus} GPUs, {gpus} visible"}
    if quick and bench.name in gpu_budget.NOT_QUICK:
        return {**row, "value": None, "verdict": f"skipped: {gpu_budget.NOT_QUICK[bench.name]}"}
    if why_not:
        return {**row, "value": None, "verdict": f"skipped: {why_not}"}
    if quick and left < need:
        return {**row, "value": None, "verdict": gpu_budget.not_run(left, need)}
    log(f"[gpu-check] {bench.name}: {bench.what} ...")
    if bench.name == "fsdp_mfu":
        row["plan"], line = _fsdp_plan_line(gpus, dry_run)
        log(f"[gpu-check] fsdp_mfu: {line}")
    timeout_s = min(cap, left) if quick else bench.timeout_s
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"gpu-check-{bench.name}-") as tmp:
        try:
            outputs = _run_one(bench, gpus, dry_run, Path(tmp), quick=quick, timeout_s=timeout_s)
        except StepTimedOut as exc:
            row.update(value=None, verdict=str(exc), last_line=exc.last_line)
        except (RuntimeError, OSError, ValueError) as exc:
            row.update(value=None, verdict=f"failed: {first_line(exc)}")
        else:
            row.update(_judge(bench, Path(tmp), outputs, dry_run))
    row["seconds"] = round(time.monotonic() - start, 1)
    return row


def failed(results: list[Mapping[str, Any]]) -> list[str]:
    """The names of the rows that failed (a crash): what makes ``dlo gpu-check`` exit 1. A step stopped by its cap
    ("timed out"), not started for lack of time ("not run"), skipped or invalid is not a failure."""
    return [r.get("benchmark") or r.get("notebook") for r in results if str(r["verdict"]).startswith("failed")]


def format_table(results: list[Mapping[str, Any]], heading: str | None = None) -> str:
    """One line per notebook or benchmark: name, seconds, measured value, target, verdict; ``heading`` first."""
    width = max([15, *(len(str(r.get("benchmark") or r.get("notebook"))) for r in results)])
    lines = [heading] if heading else []
    lines.append(f"{'notebook or benchmark':<{width}} {'seconds':>7} {'measured':>10} {'target':>10}  verdict")
    for r in results:
        value = r.get("value")
        shown = "-" if value is None else f"{value:.3g}" if _not_a_number(value) is None else "?"
        name = r.get("benchmark") or r.get("notebook")
        lines.append(f"{name:<{width}} {r.get('seconds', 0.0):>7.0f} {shown:>10} {r.get('target', '-'):>10}  "
                     f"{r['verdict']}")
    return "\n".join(lines)
