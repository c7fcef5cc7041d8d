"""A stand-in for Slurm's ``srun`` so that launch(use_srun=True) can be tested on a machine without Slurm.

It understands just what dlo.runtime.build_launch_command passes: ``--ntasks N``, ``--label`` and flags of
the form ``--x`` / ``--x=y`` (ignored), then the command. Like srun it starts N tasks with
SLURM_PROCID / SLURM_LOCALID / SLURM_STEP_* set, prefixes each output line with "<task>: ", kills the
other tasks when one fails (--kill-on-bad-exit) and reports "task <i>: Exited with exit code <c>".
"""
import os
import subprocess
import sys
import threading
import time

argv = sys.argv[1:]
ntasks, label = 1, False
while argv and argv[0].startswith("--"):
    flag = argv.pop(0)
    if flag == "--ntasks":
        ntasks = int(argv.pop(0))
    elif flag == "--label":
        label = True
command = argv


def pump(stream, task, dst):
    for line in iter(stream.readline, ""):
        dst.write(f"{task}: {line}" if label else line)
        dst.flush()


procs, threads = [], []
for task in range(ntasks):
    env = dict(os.environ, SLURM_PROCID=str(task), SLURM_LOCALID=str(task), SLURM_NODEID="0", SLURM_NTASKS=str(ntasks),
               SLURM_STEP_ID="0", SLURM_STEP_NUM_TASKS=str(ntasks), SLURM_STEP_TASKS_PER_NODE=str(ntasks),
               SLURM_STEP_NODELIST="127.0.0.1")
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    procs.append(proc)
    for stream, dst in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr)):
        threads.append(threading.Thread(target=pump, args=(stream, task, dst), daemon=True))
        threads[-1].start()

failed = None
while any(p.poll() is None for p in procs):
    bad = [i for i, p in enumerate(procs) if p.poll() not in (None, 0)]
    if bad and failed is None:
        failed = bad[0]
        for p in procs:
            if p.poll() is None:
                p.kill()
    time.sleep(0.05)
for t in threads:
    t.join(timeout=5)
codes = [p.returncode for p in procs]
for task, code in enumerate(codes):
    if code > 0:
        print(f"srun: error: localhost: task {task}: Exited with exit code {code}", file=sys.stderr)
    elif code < 0:
        print(f"srun: error: localhost: task {task}: Killed", file=sys.stderr)
sys.exit(max((c for c in codes if c > 0), default=0 if all(c == 0 for c in codes) else 1))
