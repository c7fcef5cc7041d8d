"""A local Ray whose node never registers, then a Tune scheduler (tests/test_hpo_ray.py).

``hpo.ray_start`` is given one try and a node that never registers: Ray's ``services.get_node`` fails while
``ray_start`` waits for it (``DLO_RAY_START_TIMEOUT_S`` = 1 s), then raises what Ray's own node start raises once its
fixed 30 s are over (the same failure, without spending those 30 s in Ray's loop). Then a ``PopulationBasedTraining``
is made, as test_pbt_explore_... and the notebook do: its constructor records a usage tag in Ray's key-value store.
Before the fix, the failed start had left its stopped GCS as the process's store: that call blocked, then aborted
this process. Usage: ``ray_failed_start.py TMP_DIR``; prints one JSON line.
"""
import json
import os
import sys
import time

import ray  # noqa: F401
from ray._private import services
from ray.experimental import internal_kv
from ray.tune.schedulers import PopulationBasedTraining

from dlo.lessons.hpo import ray as hray


WAIT_S = 1.0  # DLO_RAY_START_TIMEOUT_S below
first_call: list[float] = []


def never_registered(*args, **kwargs):
    first_call.append(first_call[0] if first_call else time.monotonic())
    if time.monotonic() - first_call[0] > WAIT_S:  # what ray._private.node raises after 30 s of asking
        raise Exception("The current node timed out during startup. This could happen because some of the raylet "
                        "failed to startup or the GCS has become overloaded.")
    raise RuntimeError("node not registered yet")


hray._RAY_START_ATTEMPTS = 1
os.environ["DLO_RAY_START_TIMEOUT_S"] = str(WAIT_S)
services.get_node = never_registered
try:
    hray.ray_start(num_cpus=1, temp_dir=sys.argv[1])
    error = None
except RuntimeError as exc:
    error = str(exc)
stale_store = internal_kv._internal_kv_initialized()
left = len(hray._ray_children())
PopulationBasedTraining(time_attr="training_iteration", perturbation_interval=2, hyperparam_mutations={"lr": [0.1, 0.2]})
print(json.dumps({"asks": len(first_call), "error": error, "stale_store": stale_store, "ray_processes_left": left,
                  "scheduler_made": True}))
