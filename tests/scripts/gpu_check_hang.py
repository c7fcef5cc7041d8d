"""A rank that hangs (tests/test_gpu_check.py): it starts `sleep 600` and a Python child that starts a grandchild, writes
their pids and its launcher's (torchrun's agent) to the file named on its command line, then sleeps."""
import json
import os
import subprocess
import sys
import time

pids_file = sys.argv[1]
sleeper = subprocess.Popen(["sleep", "600"])
child = subprocess.Popen([sys.executable, "-c", "import subprocess, time; g = subprocess.Popen(['sleep', '600']); "
                          "print(g.pid, flush=True); time.sleep(600)"], stdout=subprocess.PIPE, text=True)
grandchild = int(child.stdout.readline())
with open(pids_file + ".tmp", "w") as f:
    json.dump({"rank": os.getpid(), "launcher": os.getppid(), "sleep": sleeper.pid, "child": child.pid,
               "grandchild": grandchild}, f)
os.replace(pids_file + ".tmp", pids_file)
time.sleep(600)
