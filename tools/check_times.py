"""How long every exercise check takes on its reference solution, slowest first.

    DLO_LAUNCHER=fork .venv/bin/python tools/check_times.py [COURSE ...]

Each step's checker runs once on the exercise cells of its source notebook (the solutions), as a notebook's check
cell runs it; the first multi-process check of a run also pays for starting the launch server. Wall times: compare
them within one run, not across machines.
"""
from __future__ import annotations

import contextlib
import io
import sys
import time

import dlo.course.checks  # noqa: F401 - registers every checker
from dlo.course.checks import framework as F
from dlo.course.exercises import load_exercises
from dlo.runtime.paths import ROOT


def main(only: list[str]) -> int:
    rows, failed = [], 0
    for course, steps in sorted(F.REGISTRY.items()):
        if only and course not in only:
            continue
        for step, chk in steps.items():
            namespace = load_exercises(ROOT / chk.notebook)
            start = time.perf_counter()
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    F.check(course, step, namespace)
                outcome = "passed"
            except Exception as exc:  # noqa: BLE001 - reported, the others still timed
                outcome, failed = f"FAILED: {' '.join(str(exc).split())[:120]}", failed + 1
            rows.append((time.perf_counter() - start, f"{course}/{step}", outcome))
            print(f"{rows[-1][0]:7.2f} s  {course}/{step}  {outcome}", file=sys.stderr, flush=True)
    print("slowest first:")
    for seconds, name, outcome in sorted(rows, reverse=True):
        print(f"{seconds:7.2f} s  {name}  {outcome}")
    print(f"{len(rows)} checks in {sum(r[0] for r in rows):.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
