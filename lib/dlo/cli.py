"""``dlo``: the workbook's command line.

    dlo run NOTEBOOK [--profile smoke|full|dry|auto] [-p NAME VALUE ...] execute a notebook (papermill,
                                              or --engine plain: its code cells in this Python, no Jupyter);
                                              --dry-run: check the arguments and the notebook's own
                                              settings checks (cells tagged validate), start no work
    dlo check COURSE STEP [--notebook PATH]                           check an exercise step
    dlo hint COURSE STEP [--level N]                                  the next hint of a step (the idea, the
                                              shape of the computation, the API; the level is kept in runs/hints.json)
    dlo solution COURSE STEP                                          print a step's reference solution
    dlo student [--check]                                             (re)generate the student notebooks
    dlo data [--data-dir DIR] [--generated]                           say which CIFAR-10 would be used
    dlo slurm TEMPLATE [options]                                      render an sbatch script
    dlo report [--runs DIR ...] [--results DIR] [--out FILE]          one static HTML page of every notebook's
                                              results, side by side per device, with the recorded GPU runs and
                                              the cited references (default runs/report.html)
    dlo gpu-check [--dry-run] [--quick] [--only NAME ...] [--skip NAME ...]    every full-profile benchmark,
                                              judged against its target (results/gpu-check-<gpu>-<date>.json);
                                              --quick: every notebook's dry profile on the GPU too, in minutes
    dlo train | race | mix-bench | hpo worker [options]               one layer's command (its own --help)

``python -m dlo ...`` is the same command without the console script.

Exit codes: 0 success; 1 a failed check, a stale student notebook or a notebook whose cell failed; 2 a usage
error (unknown option, missing or wrong argument, unknown course or step, a parameter the notebook does not have
or of the wrong type, an output folder that cannot be written), reported in one line on stderr before anything
runs; 141 the reader of the output went away (``dlo hint ... | head``), quietly. A failed check prints the line
the notebook shows: ``NOT YET course/step: what is wrong -- hint: dlo hint course step``.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any

from dlo.runtime.arguments import ScriptParser


def _cmd_run(args: argparse.Namespace) -> int:
    from dlo.course.notebooks import NotebookError, parse_value
    from dlo.course.runner import check_request, run_notebook, run_plain

    params = {name: parse_value(value) for name, value in (args.param or [])}
    try:
        if args.dry_run:
            notebook, injected, out = check_request(args.notebook, profile=args.profile, parameters=params,
                                                    out_dir=args.out_dir)
            shown = ", ".join(f"{k}={v!r}" for k, v in injected.items())
            print(f"ok: {notebook.name} would run with {shown}; output folder {out}")
            return 0
        if params:  # values given by hand: the notebook's own checks refuse a bad one in one line before any work
            check_request(args.notebook, profile=args.profile, parameters=params, out_dir=args.out_dir)
        if args.engine == "plain":
            run_plain(args.notebook, profile=args.profile, parameters=params, out_dir=args.out_dir)
            print(f"ran {args.notebook} as a plain script")
            return 0
        executed = run_notebook(args.notebook, profile=args.profile, parameters=params, out_dir=args.out_dir,
                                log_output=not args.quiet)
    except NotebookError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ValueError) else 1  # NotebookArgumentError: nothing ran
    print(f"executed notebook: {executed}")
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    if args.list or args.step is None:
        from dlo.course import catalog  # the steps, read from the checkers' source without importing them (torch)

        table = catalog.steps()
        if args.course is not None and args.course not in table:
            raise ValueError(catalog.unknown_name(args.course, None, table))  # as check()
        for course, steps in table.items():
            if args.course in (None, course):
                print(f"{course}: {' '.join(steps)}")
        return 0
    _known_step(args.course, args.step, args.notebook)  # before the checkers import torch (seconds, or a minute)
    from dlo.course.checks.framework import CheckFailed, check_notebook

    try:
        check_notebook(args.course, args.step, args.notebook)
    except CheckFailed as exc:  # the words the notebook shows: NOT YET course/step: what is wrong -- hint: ...
        print(exc.one_line(), file=sys.stderr)
        return 1
    return 0


def _known_step(course: str, step: str, notebook: str | None) -> None:
    """The one-line errors of ``check_notebook`` for an unknown course or step or a missing notebook, from the
    checkers' source text (:mod:`dlo.course.catalog`), without importing them."""
    from pathlib import Path

    from dlo.course import catalog
    from dlo.runtime.paths import ROOT

    table = catalog.steps()
    problem = catalog.unknown_name(course, step, table)
    if problem:
        raise ValueError(problem)
    source = ROOT / table[course][step].notebook
    path = Path(notebook) if notebook else source.parent / "student" / source.name
    if not path.is_file():
        raise FileNotFoundError(f"no notebook or script at {path}: run `make student` or pass --notebook PATH")


def _cmd_hint(args: argparse.Namespace) -> int:
    from dlo.course.hints import LEVELS, STATE_FILE, advance, levels

    level, not_kept = advance(args.course, args.step, args.level)
    print(f"Hint {level}/{LEVELS} for {args.course}/{args.step}:")
    print(levels(args.course, args.step)[level - 1])
    if level < LEVELS and not_kept:
        print(f"(the level reached is not kept: {not_kept}; `dlo hint {args.course} {args.step} --level "
              f"{level + 1}` shows the next one)")
    elif level < LEVELS:
        print(f"(run it again for the next level; the level reached is kept in {STATE_FILE})")
    else:
        print(f"(the last level; `dlo solution {args.course} {args.step}` prints the solution)")
    return 0


def _cmd_solution(args: argparse.Namespace) -> int:
    import textwrap

    from dlo.course.student import step_solution

    for name, _, code in step_solution(args.course, args.step):
        print(f"# {args.course}/{args.step}, in {name}:")
        print(textwrap.dedent(code))
    return 0


def _cmd_student(args: argparse.Namespace) -> int:
    from dlo.course.student import write_students

    stale = write_students(check_only=args.check)
    if args.check:
        for p in stale:
            print(f"stale student notebook: {p} (run `make student`)", file=sys.stderr)
        return 1 if stale else 0
    for p in stale:
        print(f"wrote {p}")
    if not stale:
        print("student notebooks are up to date")
    return 0


def _cmd_data(args: argparse.Namespace) -> int:
    from pathlib import Path

    from dlo import data
    from dlo.runtime.paths import probe_writable

    if args.generated and args.data_dir is not None:  # generated data is written there: check before generating
        folder = Path(args.data_dir)
        if folder.exists() and not folder.is_dir():
            raise ValueError(f"--data-dir {folder} is a file: give a folder (the generated data set goes in "
                             f"<folder>/cifar-10-batches-py)")
        try:
            probe_writable(folder)
        except OSError as exc:
            raise ValueError(f"--data-dir {folder} is not writable ({exc.strerror or exc}): give a folder you can "
                             "write to, or leave --data-dir out (the generated set then goes in the cache)") from None
    ds = data.cifar10("train", args.data_dir, generated=True if args.generated else None)
    print(ds.source)
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from dlo.course.report import build_report

    print(build_report(runs=args.runs, results=args.results, out=args.out))
    return 0


def _cmd_gpu_check(args: argparse.Namespace) -> int:
    from dlo.course.gpu_check import failed, format_table, run_checks

    payload = run_checks(dry_run=args.dry_run, only=args.only, skip=args.skip, out_path=args.out, quick=args.quick,
                         notebooks=args.notebooks, jobs=args.jobs, budget_s=args.budget)
    print(format_table(payload["results"], payload["title"]))
    print(f"wrote {payload['path']}" + ("" if args.dry_run else ": commit it under results/"))
    return 1 if failed(payload["results"]) else 0


#: The names `dlo gpu-check --only/--skip` take, for its --help without importing the benchmarks (torch); kept equal
#: to dlo.course.gpu_benchmarks.BENCHMARKS by tests/test_gpu_check.py.
GPU_BENCHMARK_NAMES = ("jour1_ladder", "mixcutmix", "fsdp_mfu", "pipeline_1f1b", "tp_vs_dtensor", "grid_3d", "race")

def build_parser() -> argparse.ArgumentParser:
    """The parser of ``dlo``: one sub-command per task, each added by its own function."""
    p = ScriptParser(prog="dlo", description="Deep Learning Optimise workbook tools")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_run(sub)
    _add_exercises(sub)
    _add_data_and_gpu_check(sub)
    _add_report(sub)
    _add_delegated(sub)
    return p


def _add_run(sub: Any) -> None:
    r = sub.add_parser("run", help="execute a notebook with papermill into runs/<name>/")
    r.add_argument("notebook")
    r.add_argument("--profile", default="auto", help="smoke (CPU, minutes), full (GPU node), dry (the full profile's code paths on a CPU, "
                        "scaled down: rehearse a GPU job) or auto (default)")
    r.add_argument("-p", "--param", nargs=2, action="append", metavar=("NAME", "VALUE"),
                   help="set a notebook parameter (repeatable); values are Python literals or strings")
    r.add_argument("--out-dir", default=None, help="where the executed notebook goes (default runs/<name>/)")
    r.add_argument("--quiet", action="store_true",
                   help="print nothing while it runs (default: a line per code cell and what the cells print)")
    r.add_argument("--dry-run", action="store_true",
                   help="check the notebook, parameters (names and types), output folder and the notebook's own "
                        "settings checks (its cells tagged 'validate'), then stop before any work")
    r.add_argument("--engine", choices=["papermill", "plain"], default="papermill",
                   help="papermill (default: executed notebook saved) or plain (this Python, no Jupyter needed)")
    r.set_defaults(func=_cmd_run)


def _add_exercises(sub: Any) -> None:
    """``dlo check``, ``dlo hint``, ``dlo solution``, ``dlo student``."""
    c = sub.add_parser("check", help="check an exercise step (default: in the student notebook)")
    c.add_argument("course", nargs="?", default=None,
                   help="a course, as the notebook's check cell names it (jour1, optimizers, fsdp ...); alone: its "
                        "steps")
    c.add_argument("step", nargs="?", default=None, help="the exercise step of that course (amp, lion ...); "
                                                        "`dlo check --list` shows every course and step")
    c.add_argument("--notebook", default=None,
                   help="notebook or script whose exercise cells are checked (default: the course's student copy, "
                        "e.g. Jour1/student/jour1.ipynb)")
    c.add_argument("--list", action="store_true", help="list the steps that have a checker")
    c.set_defaults(func=_cmd_check)

    h = sub.add_parser("hint", help="the next hint of an exercise step (the idea, then the shape of the computation, then the API)")
    h.add_argument("course", help="the course, as the TODO's `dlo hint COURSE STEP` line names it")
    h.add_argument("step", help="the exercise step; `dlo check --list` shows every course and step")
    h.add_argument("--level", type=int, default=None, help="show this level (1-3) instead of the next one")
    h.set_defaults(func=_cmd_hint)

    so = sub.add_parser("solution", help="print the reference solution of an exercise step")
    so.add_argument("course", help="the course (`dlo check --list` shows every course and step)")
    so.add_argument("step", help="the exercise step")
    so.set_defaults(func=_cmd_solution)

    s = sub.add_parser("student", help="regenerate the student notebooks from the sources")
    s.add_argument("--check", action="store_true", help="write nothing; exit 1 if any is stale")
    s.set_defaults(func=_cmd_student)


def _add_data_and_gpu_check(sub: Any) -> None:
    d = sub.add_parser("data", help="say which CIFAR-10 data set would be used (generating it if needed)")
    d.add_argument("--data-dir", default=None, metavar="DIR",
                   help="folder holding cifar-10-batches-py, which must then be there (default: the first found "
                        "in $DLO_DATA_DIR, $DSDIR, <project>/data, else the generated set); with --generated, where "
                        "the generated set is written (default: the cache)")
    d.add_argument("--generated", action="store_true",
                   help="the generated data set in the CIFAR-10 format (written on first use), even where the "
                        "real one is found")
    d.set_defaults(func=_cmd_data)

    g = sub.add_parser("gpu-check", help="every full-profile benchmark on this GPU node, judged against its target")
    g.add_argument("--dry-run", action="store_true",
                   help="the same commands on the CPU at smoke size (DRY RUN: targets not judged); what CI runs")
    names = ", ".join(GPU_BENCHMARK_NAMES)
    g.add_argument("--only", nargs="+", default=None, metavar="NAME", help=f"run these benchmarks only: {names}")
    g.add_argument("--skip", nargs="+", default=None, metavar="NAME", help="leave these benchmarks out (same names)")
    g.add_argument("--out", default=None, help="the JSON file (default results/gpu-check-<gpu>-<date>.json; "
                                               "runs/gpu-check/ for a dry run)")
    from dlo.course.gpu_budget import DRY_BUDGET_S, QUICK_BUDGET_S, quick_plan_text  # no torch: --help stays light

    g.add_argument("--quick", action="store_true",
                   help="one short acceptance run, under 8 minutes on one GPU: the one-GPU target benchmarks first "
                        f"with fewer timed steps, each under its cap: {quick_plan_text()}. A step cut by its cap reads "
                        "'timed out after N s', one not started for lack of time 'not run' (neither is a failure)")
    g.add_argument("--notebooks", nargs="+", default=None, metavar="NB",
                   help="with --quick: these notebooks only (default: every course notebook)")
    g.add_argument("--jobs", type=int, default=None,
                   help="with --quick: notebooks run at a time (default: cores / 4, at most 4)")
    g.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                   help=f"with --quick: the whole run's time (default {QUICK_BUDGET_S:.0f} s; "
                        f"{DRY_BUDGET_S:.0f} s with --dry-run)")
    g.set_defaults(func=_cmd_gpu_check)


def _add_report(sub: Any) -> None:
    r = sub.add_parser("report", help="one static HTML page of every notebook's results, with the recorded GPU "
                                      "runs and the cited references beside them")
    r.add_argument("--runs", nargs="+", default=None, metavar="DIR",
                   help="folders holding <notebook>/results.json and its figures (default runs/, or $DLO_RUNS_DIR); "
                        "several: their runs side by side")
    r.add_argument("--results", default=None, metavar="DIR",
                   help="the recorded GPU runs: <notebook>-<gpu>-<date>.json and gpu-check-*.json (default results/)")
    r.add_argument("--out", default=None, metavar="FILE",
                   help="the page to write (default: report.html in the first --runs folder, runs/report.html)")
    r.set_defaults(func=_cmd_report)


def _add_delegated(sub: Any) -> None:
    # Commands that belong to one layer each; they parse their own options (`dlo train --help`). They need only
    # torch and torchvision, so `python -m dlo train ...` runs where Jupyter is not installed (a GPU node).
    for name, module, what in _DELEGATED:
        x = sub.add_parser(name, help=what, add_help=False)
        x.add_argument("rest", nargs=argparse.REMAINDER)
        x.set_defaults(func=lambda a, module=module: _module_main(module, a.rest))


_DELEGATED = (
    ("slurm", "dlo.runtime.slurm", "render an sbatch template (see slurm/README.md)"),
    ("train", "dlo.training.cli", "train the CIFAR ResNet with dlo's loop (checkpoints, exact resume)"),
    ("race", "dlo.lessons.race", "one attempt of the CIFAR-10 race (time to target accuracy)"),
    ("mix-bench", "dlo.lessons.mixing", "time MixUp/CutMix: the per-sample loop against the batched kernel"),
    ("hpo", "dlo.lessons.hpo.journal", "`dlo hpo worker ...`: an Optuna worker process on a study shared through a journal file"),
)


def _module_main(module: str, argv: list[str]) -> int:
    import importlib

    return importlib.import_module(module).main(argv)


#: The exit code when the reader of our output went away (``dlo hint ... | head``): a shell's code for a command
#: stopped by SIGPIPE, which is what a C program would get.
CLOSED_PIPE = 128 + 13


def main(argv: list[str] | None = None) -> int:
    try:
        try:
            return _main(argv)
        finally:  # a reader that has gone shows here (also after --help), not as a traceback while Python exits
            sys.stdout.flush()
    except BrokenPipeError:  # `dlo hint ... | head`: nobody reads the rest; stop quietly
        import os

        with open(os.devnull, "w") as devnull:  # what is still buffered for stdout goes nowhere at exit
            os.dup2(devnull.fileno(), sys.stdout.fileno())
        return CLOSED_PIPE


def _main(argv: list[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    delegated = {name: module for name, module, _ in _DELEGATED}
    if argv and argv[0] in delegated:  # its options are its own (argparse's REMAINDER would take some as ours)
        return _module_main(delegated[argv[0]], argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
