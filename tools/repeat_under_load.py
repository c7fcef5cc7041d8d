"""Run a pytest selection N times in a row beside a CPU load, and count the runs that pass.

A multi-process test can pass on an idle machine and crash when its processes are slowed down (a rank
starting late, a timeout, a race at exit). This repeats it with ``--load`` busy processes running beside it,
each spinning on one core, so that such failures show up here rather than in CI::

    .venv/bin/python tools/repeat_under_load.py -n 20 --load 2 tests/test_fsdp.py

Prints one line per run (passed or the failing run's last lines) and a summary; exits 1 if any run failed.
Not part of ``make test``: 20 runs take many minutes.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import subprocess
import sys
import time


def _spin(stop) -> None:
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x = (x * 1103515245 + 12345) % 2**31


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-n", "--runs", type=int, default=20)
    p.add_argument("--load", type=int, default=2, help="busy processes beside the tests (one core each)")
    p.add_argument("pytest_args", nargs="+", help="what to pass to pytest, e.g. tests/test_fsdp.py")
    args = p.parse_args(argv)
    if args.runs < 1 or args.load < 0:
        p.error("--runs must be >= 1 and --load >= 0")
    stop = mp.Event()
    spinners = [mp.Process(target=_spin, args=(stop,), daemon=True) for _ in range(args.load)]
    for s in spinners:
        s.start()
    failed = 0
    try:
        for i in range(1, args.runs + 1):
            start = time.monotonic()
            done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args.pytest_args],
                                  capture_output=True, text=True)
            took = time.monotonic() - start
            summary = (done.stdout.strip().splitlines() or ["(no output)"])[-1]
            if done.returncode == 0:
                print(f"run {i:2d}/{args.runs}: passed in {took:.0f} s ({summary})", flush=True)
            else:
                failed += 1
                tail = "\n    ".join((done.stdout + done.stderr).strip().splitlines()[-15:])
                print(f"run {i:2d}/{args.runs}: FAILED in {took:.0f} s ({summary})\n    {tail}", flush=True)
    finally:
        stop.set()
        for s in spinners:
            s.join(timeout=5)
    print(f"{args.runs - failed} of {args.runs} runs passed beside {args.load} busy process(es)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
