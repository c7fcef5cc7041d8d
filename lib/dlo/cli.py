"""``dlo``: the workbook's command line.

    dlo run NOTEBOOK [--profile smoke|full|auto] [-p NAME VALUE ...]   execute a notebook (papermill,
                                              or --engine plain: its code cells in this Python, no Jupyter)
    dlo check COURSE STEP [--notebook PATH]                           check an exercise step
    dlo student [--check]                                             (re)generate the student notebooks
    dlo data [--data-dir DIR] [--generated]                           say which CIFAR-10 would be used
    dlo slurm TEMPLATE [options]                                      render an sbatch script
    dlo train | race | mix-bench | hpo worker [options]               one layer's command (its own --help)

``python -m dlo ...`` is the same command without the console script.

Errors are reported in one line on stderr with exit code 2 (1 for a failed check or notebook).
"""
from __future__ import annotations

import argparse
import sys


def _cmd_run(args: argparse.Namespace) -> int:
    from dlo.course.notebooks import NotebookError, parse_value
    from dlo.course.runner import run_notebook, run_plain

    params = {name: parse_value(value) for name, value in (args.param or [])}
    try:
        if args.engine == "plain":
            run_plain(args.notebook, profile=args.profile, parameters=params, out_dir=args.out_dir)
            print(f"ran {args.notebook} as a plain script")
            return 0
        executed = run_notebook(args.notebook, profile=args.profile, parameters=params, out_dir=args.out_dir,
                                log_output=not args.quiet)
    except NotebookError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"executed notebook: {executed}")
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    from dlo.course.checks.framework import REGISTRY, CheckFailed, check_notebook

    if args.list or args.step is None:
        for course, steps in REGISTRY.items():
            if args.course in (None, course):
                print(f"{course}: {' '.join(steps)}")
        return 0
    try:
        check_notebook(args.course, args.step, args.notebook)
    except CheckFailed as exc:
        print(f"FAILED {exc}", file=sys.stderr)
        return 1
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
    from dlo import data

    ds = data.cifar10("train", args.data_dir, generated=True if args.generated else None)
    print(ds.source)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dlo", description="Deep Learning Optimise workbook tools")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="execute a notebook with papermill into runs/<name>/")
    r.add_argument("notebook")
    r.add_argument("--profile", default="auto", help="smoke (CPU, minutes), full (GPU node) or auto (default)")
    r.add_argument("-p", "--param", nargs=2, action="append", metavar=("NAME", "VALUE"),
                   help="set a notebook parameter (repeatable); values are Python literals or strings")
    r.add_argument("--out-dir", default=None, help="where the executed notebook goes (default runs/<name>/)")
    r.add_argument("--quiet", action="store_true", help="do not stream the cells' output")
    r.add_argument("--engine", choices=["papermill", "plain"], default="papermill",
                   help="papermill (default: executed notebook saved) or plain (this Python, no Jupyter needed)")
    r.set_defaults(func=_cmd_run)

    c = sub.add_parser("check", help="check an exercise step (default: in the student notebook)")
    c.add_argument("course", nargs="?", default=None)
    c.add_argument("step", nargs="?", default=None)
    c.add_argument("--notebook", default=None, help="notebook whose exercise cells are checked")
    c.add_argument("--list", action="store_true", help="list the steps that have a checker")
    c.set_defaults(func=_cmd_check)

    s = sub.add_parser("student", help="regenerate the student notebooks from the sources")
    s.add_argument("--check", action="store_true", help="write nothing; exit 1 if any is stale")
    s.set_defaults(func=_cmd_student)

    d = sub.add_parser("data", help="say which CIFAR-10 data set would be used (generating it if needed)")
    d.add_argument("--data-dir", default=None)
    d.add_argument("--generated", action="store_true")
    d.set_defaults(func=_cmd_data)

    sl = sub.add_parser("slurm", help="render an sbatch template (see slurm/README.md)", add_help=False)
    sl.add_argument("rest", nargs=argparse.REMAINDER)
    sl.set_defaults(func=lambda a: _module_main("dlo.runtime.slurm", a.rest))

    # Commands that belong to one layer each; they parse their own options (`dlo train --help`). They need only
    # torch and torchvision, so `python -m dlo train ...` runs where Jupyter is not installed (a GPU node).
    for name, module, what in _DELEGATED:
        x = sub.add_parser(name, help=what, add_help=False)
        x.add_argument("rest", nargs=argparse.REMAINDER)
        x.set_defaults(func=lambda a, module=module: _module_main(module, a.rest))
    return p


_DELEGATED = (
    ("train", "dlo.training.cli", "train the CIFAR ResNet with dlo's loop (checkpoints, exact resume)"),
    ("race", "dlo.lessons.race", "one attempt of the CIFAR-10 race (time to target accuracy)"),
    ("mix-bench", "dlo.lessons.mixing", "time MixUp/CutMix: the per-sample loop against the batched kernel"),
    ("hpo", "dlo.lessons.hpo.journal", "`dlo hpo worker ...`: an Optuna worker process on a study shared through a journal file"),
)


def _module_main(module: str, argv: list[str]) -> int:
    import importlib

    return importlib.import_module(module).main(argv)


def main(argv: list[str] | None = None) -> int:
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


if __name__ == "__main__":
    sys.exit(main())
