"""dlo.runtime.process_tree: a step that hangs is stopped at its cap with every process it started, children,
grandchildren and a launcher in a session of its own (as torchrun is started), and nothing of it is left running."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from dlo.runtime.process_tree import run_capped, running

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux's /proc")

#: A step that hangs: it starts `sleep 600`, a Python child that starts a grandchild (`sleep 600`) and hangs, and a
#: launcher in a new session (like torchrun under dlo.runtime.launch) with a rank of its own; it writes their pids.
HANGING = r'''
import json, os, subprocess, sys, time
pids_file = sys.argv[1]
sleeper = subprocess.Popen(["sleep", "600"])
child = subprocess.Popen([sys.executable, "-c",
    "import subprocess, sys, time; g = subprocess.Popen(['sleep', '600']); print(g.pid, flush=True); time.sleep(600)"],
    stdout=subprocess.PIPE, text=True)
grandchild = int(child.stdout.readline())
launcher = subprocess.Popen([sys.executable, "-c",
    "import subprocess, time; r = subprocess.Popen(['sleep', '600']); print(r.pid, flush=True); time.sleep(600)"],
    stdout=subprocess.PIPE, text=True, start_new_session=True)
rank = int(launcher.stdout.readline())
with open(pids_file + ".tmp", "w") as f:
    json.dump({"step": os.getpid(), "sleep": sleeper.pid, "child": child.pid, "grandchild": grandchild,
               "launcher": launcher.pid, "rank": rank}, f)
os.replace(pids_file + ".tmp", pids_file)
print("all started", flush=True)
time.sleep(600)
'''


def test_a_hanging_step_is_killed_with_its_children_grandchildren_and_launched_session(tmp_path):
    script, pids_file = tmp_path / "hang.py", tmp_path / "pids.json"
    script.write_text(HANGING)
    start = time.monotonic()
    done = run_capped([sys.executable, str(script), str(pids_file)], timeout_s=8)
    assert done.timed_out and done.returncode is None and time.monotonic() - start < 40
    pids = json.loads(pids_file.read_text())
    assert set(pids) == {"step", "sleep", "child", "grandchild", "launcher", "rank"}
    left = {name: pid for name, pid in pids.items() if running(pid)}
    assert not left, f"still running after the cap: {left}"
    assert done.killed >= 6 and "all started" in done.stdout


def test_a_step_that_exits_leaving_a_grandchild_behind_leaves_nothing(tmp_path):
    """The step ends (exit 0) but the sleep it started in the background would go on: it is killed too."""
    script = tmp_path / "leave.py"
    script.write_text("import subprocess, sys\np = subprocess.Popen(['sleep', '600'])\nprint(p.pid)\n")
    done = run_capped([sys.executable, str(script)], timeout_s=60)
    assert not done.timed_out and done.returncode == 0
    assert not running(int(done.stdout.split()[0])) and done.killed == 1


def test_a_quick_step_returns_its_output_and_exit_code(tmp_path):
    done = run_capped([sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"],
                      timeout_s=60)
    assert (done.returncode, done.stdout.strip(), done.stderr.strip(), done.timed_out) == (3, "out", "err", False)
