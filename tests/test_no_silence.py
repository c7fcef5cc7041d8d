"""No silence over 30 s in a batch log: a real notebook run through `dlo run --engine plain`, its output read line by
line as it arrives (through a pipe, block-buffered as a batch job's log file is), timestamped here.

The notebook is Jour1/shapes.ipynb, smoke profile: about a minute on 2 busy cores, and among its cells one of the
slowest of the smoke runs that stay silent -- its first cell (the imports: torch, torchvision, pandas, matplotlib;
20-30 s on a loaded 2-core machine) prints nothing of its own. The longest gap between two lines must be under
30 s; where a cell's own output is slower than that, the runner's watchdog line (``--- code cell N/M still
running``, written after 30 s of silence: twice ``DLO_PROGRESS_INTERVAL``'s 15 s) is what breaks the silence, and
the gap that ends with it may exceed 30 s by the scheduling delay only.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

from dlo.runtime import progress
from dlo.runtime.paths import ROOT

NOTEBOOK = "Jour1/shapes.ipynb"
LIMIT_S = 30.0
#: How late the watchdog's line may come on a loaded machine (its thread waits to be scheduled).
HEARTBEAT_SLACK_S = 3.0
HEARTBEAT = "still running"


def timestamped_run(args: list[str], env: dict[str, str], timeout_s: float) -> tuple[int, list[tuple[float, str]]]:
    """Run ``args``, stdout and stderr together through a pipe; every line with the seconds since the start at
    which it arrived; a last entry ``(seconds, "<exit>")`` for the end."""
    start = time.monotonic()
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        for line in proc.stdout:
            lines.append((time.monotonic() - start, line.rstrip("\n")))
            if time.monotonic() - start > timeout_s:
                raise TimeoutError(f"still running after {timeout_s:.0f} s; last line: {line.strip()!r}")
        code = proc.wait(timeout=max(1.0, timeout_s - (time.monotonic() - start)))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines.append((time.monotonic() - start, "<exit>"))
    return code, lines


def gaps(lines: list[tuple[float, str]]) -> list[tuple[float, str, str]]:
    """``(seconds of silence, the line before, the line that ended it)``, from the start of the process."""
    out, before, then = [], "<start>", 0.0
    for at, line in lines:
        out.append((at - then, before, line))
        before, then = line, at
    return out


def test_gaps_are_measured_from_the_start_and_end_at_the_line_that_breaks_them():
    stamped = [(2.0, "a"), (40.0, "--- code cell 1/2 still running"), (41.0, "<exit>")]
    assert gaps(stamped) == [(2.0, "<start>", "a"), (38.0, "a", "--- code cell 1/2 still running"),
                             (1.0, "--- code cell 1/2 still running", "<exit>")]


@pytest.mark.notebook
def test_a_plain_run_of_a_smoke_notebook_is_never_silent_for_30_s(tmp_path):
    env = {**os.environ, "DLO_RUNS_DIR": str(tmp_path)}
    env.pop(progress.INTERVAL_ENV, None)  # the default rate: bars every 15 s, the watchdog after 30 s of silence
    env.pop("PYTHONUNBUFFERED", None)  # as a batch log: the lines must be flushed by the runner itself
    code, lines = timestamped_run([sys.executable, "-m", "dlo", "run", NOTEBOOK, "--engine", "plain", "--profile",
                                   "smoke", "--out-dir", str(tmp_path / "shapes")], env, timeout_s=900)
    text = "\n".join(f"{at:6.1f} {line}" for at, line in lines)
    assert code == 0, text[-3000:]
    assert any(re.match(r"--- \d+ code cells in ", line) for _, line in lines), text[-3000:]  # it ran to the end
    silent = [(s, before, after) for s, before, after in gaps(lines) if s >= LIMIT_S]
    # a silence of 30 s or more is only allowed where the watchdog's line ends it, as soon as it is due
    unbroken = [g for g in silent if HEARTBEAT not in g[2] or g[0] > LIMIT_S + HEARTBEAT_SLACK_S]
    assert not unbroken, "silent for 30 s or more: " + "; ".join(
        f"{s:.1f} s after {before!r}, until {after!r}" for s, before, after in unbroken) + "\n" + text[-3000:]
    # and the line the watchdog writes names the cell that was silent
    for _, _, after in silent:
        assert after.startswith("--- code cell ") and "nothing printed for 30 s" in after, after
