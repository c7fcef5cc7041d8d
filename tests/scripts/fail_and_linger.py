"""Worker for tests/test_launch_safety.py: rank 1 fails at once; the others would go on for a minute.

Each rank first writes a record with its pid; a rank still running after 60 s writes a second one ("finished").
A launcher that stops the peers of a failed rank leaves no "finished" record and no process behind.
"""
import os
import time

import dlo  # noqa: F401
from dlo.runtime import dist_context, write_record

rank = dist_context().rank
write_record({"pid": os.getpid(), "stage": "started"})
if rank == 1:
    raise ValueError("rank 1 fails at once")
time.sleep(60)
write_record({"pid": os.getpid(), "stage": "finished"})
