"""What a launch is asked to do, checked before anything starts: the launcher, the script, the process counts,
the records folder and the ranks' environment (one clear line for each mistake)."""
from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dlo.runtime.errors import TooFewGPUs
from dlo.runtime.paths import run_dir
from dlo.runtime.records import RECORDS_ENV, _RECORD_FILE

#: ``DLO_LAUNCHER=fork`` makes :func:`launch` start its local ranks with :func:`launch_forked` instead of
#: torchrun (``torchrun``, the default, or unset: torchrun). For rehearsals that launch dozens of short runs on
#: a CPU (the ``dry`` profile): each torchrun launch starts N+1 Pythons that import torch (seconds each), forked
#: ranks import it once. Inside a Slurm job srun is still used. What the ranks compute is the same.
LAUNCHER_ENV = "DLO_LAUNCHER"
LAUNCHERS = ("torchrun", "fork")


def _can_fork_server() -> bool:
    import multiprocessing

    return "forkserver" in multiprocessing.get_all_start_methods()  # not on Windows: torchrun it is


def launcher_choice() -> str:
    """The local launcher :func:`launch` uses: ``$DLO_LAUNCHER`` ("torchrun" when unset); one line if unknown."""
    value = os.environ.get(LAUNCHER_ENV, "").strip().lower() or "torchrun"
    if value not in LAUNCHERS:
        raise ValueError(f"{LAUNCHER_ENV}={value!r} is not a launcher: set it to one of {', '.join(LAUNCHERS)}, "
                         "or unset it for torchrun")
    return value


def _check_nproc(nproc: Any) -> int:
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc must be an integer >= 1, got {nproc!r}")
    return nproc


def check_processes(nprocs: Any, device: Any, *, least: int = 1, what: str = "this run",
                    gpus: int | None = None) -> list[int]:
    """The process counts a notebook is about to launch, checked before anything starts (one line each).

    ``nprocs``: one count or a list of counts (world sizes). Each must be an integer ``>= least`` (what the
    lesson needs, e.g. 2 for data parallelism); on a CUDA ``device`` none may exceed the GPUs visible here
    (``gpus``, default ``torch.cuda.device_count()``): NCCL gives each process its own GPU, and two ranks of
    one communicator on one GPU are refused at their first collective, after minutes of start-up. On a CPU
    (gloo) more processes than cores only share the cores: that is allowed. Returns the counts as a list."""
    counts = list(nprocs) if isinstance(nprocs, (list, tuple)) else [nprocs]
    bad = [n for n in counts if isinstance(n, bool) or not isinstance(n, int) or n < least]
    if not counts or bad:
        raise ValueError(f"{what} needs at least {least} process(es) per run, got {nprocs!r}: on a node with fewer GPUs "
                         f"use profile 'smoke' (CPU) or 'dry' (the full profile rehearsed on a CPU)")
    if getattr(device, "type", str(device).split(":")[0]) == "cuda":
        if gpus is None:
            import torch

            gpus = torch.cuda.device_count()
        if max(counts) > gpus:
            raise TooFewGPUs(f"{what} launches {max(counts)} processes but only {gpus} GPU(s) are visible: NCCL "
                             f"needs one GPU per process; use a node with {max(counts)} GPUs, or fewer processes",
                             needed=max(counts), visible=gpus)
    return counts


def _check_args(args: Any) -> list[str]:
    if isinstance(args, (str, bytes)):
        raise ValueError(f"args must be a list of strings like ['--epochs', '3'], not the single string {args!r}")
    return [str(a) for a in args]



_RANK_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "TORCHELASTIC_RUN_ID")


def _usable_cpus() -> int:
    """Cores this process may run on (respects taskset / cgroup affinity, unlike os.cpu_count())."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS has no sched_getaffinity
        return os.cpu_count() or 1



def expand_runs(args: Any, runs_json: str | None) -> list[tuple[str, Any]]:
    """The configurations of a "several runs in one launch" script: ``[(name, args_for_that_run), ...]``.

    ``runs_json`` (a script's ``--runs`` option) is a JSON list of dicts, each overriding some of the
    parsed ``args`` (an ``argparse.Namespace``) and optionally naming the run (``"name"``, default
    ``run<i>``); None or empty means one run with ``args`` as they are. Starting processes costs seconds,
    so a notebook measures several configurations in one launch. A key that is not an option of the script
    is a one-line error naming the options there are.
    """
    import argparse

    runs = json.loads(runs_json) if runs_json else [{}]
    if not isinstance(runs, list) or not all(isinstance(r, dict) for r in runs):
        raise ValueError(f"--runs must be a JSON list of dicts, got {runs_json!r}")
    out = []
    for i, overrides in enumerate(runs):
        overrides = dict(overrides)
        name = str(overrides.pop("name", f"run{i}"))
        unknown = sorted(set(overrides) - set(vars(args)))
        if unknown:
            raise ValueError(f"--runs entry {name!r} sets unknown option(s) {', '.join(unknown)}: "
                             f"use {', '.join(sorted(vars(args)))}")
        out.append((name, argparse.Namespace(**{**vars(args), **overrides})))
    return out


def _check_request(script: Any, args: Any, nproc: Any, timeout_s: Any) -> tuple[Path, list[str], int]:
    """A launch's arguments checked before anything starts: one clear line for each mistake."""
    nproc = _check_nproc(nproc)
    args = _check_args(args)
    script_path = Path(script).expanduser().resolve()
    if not script_path.is_file():
        raise ValueError(f"script {script} does not exist (resolved to {script_path}): check the path")
    if timeout_s is not None and timeout_s <= 0:
        raise ValueError(f"timeout_s must be a positive number of seconds or None, got {timeout_s!r}")
    return script_path, args, nproc


def _records_folder(script_path: Path, records_dir: str | os.PathLike | None) -> Path:
    """``records_dir`` (which must hold no records yet), or a fresh ``runs/launch/<script>-<time>-*`` folder."""
    if records_dir is None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        return Path(tempfile.mkdtemp(prefix=f"{script_path.stem}-{stamp}-", dir=run_dir("launch")))
    folder = Path(records_dir).expanduser().resolve()
    folder.mkdir(parents=True, exist_ok=True)
    if any(_RECORD_FILE.match(p.name) for p in folder.iterdir()):
        raise ValueError(
            f"records folder {folder} already holds rank*.jsonl from an earlier run: "
            "pass an empty folder or records_dir=None"
        )
    return folder


def _child_env(env: Mapping[str, str | None] | None, folder: Path) -> dict[str, str]:
    """The ranks' environment: the caller's without its rank variables (each rank gets its own from the
    launcher, never from the caller, which may itself be a rank), plus ``env`` (None removes a variable)."""
    child_env = {k: v for k, v in os.environ.items() if k not in _RANK_VARS}
    for key, value in (env or {}).items():
        if value is None:
            child_env.pop(str(key), None)
        else:
            child_env[str(key)] = str(value)
    child_env[RECORDS_ENV] = str(folder)
    child_env["PYTHONUNBUFFERED"] = "1"
    return child_env

