"""A local Ray whose node never registers, then a Tune scheduler (tests/test_hpo_ray.py).

``hpo.ray_start`` is given one try and a node that never registers (Ray's ``services.get_node`` always fails), so
it fails after Ray's own 30 s. Then a ``PopulationBasedTraining`` is made, as test_pbt_explore_... and the notebook
do: its constructor records a usage tag in Ray's key-value store. Before the fix, the failed start had left its
stopped GCS as the process's store: that call blocked, then aborted this process. Usage: ``ray_failed_start.py
TMP_DIR``; prints one JSON line.
"""
import json
import os
import sys

import ray  # noqa: F401
from ray._private import services
from ray.experimental import internal_kv
from ray.tune.schedulers import PopulationBasedTraining

from dlo.lessons.hpo import ray as hray


def never_registered(*args, **kwargs):
    raise RuntimeError("node not registered yet")


hray._RAY_START_ATTEMPTS = 1
os.environ["DLO_RAY_START_TIMEOUT_S"] = "1"
services.get_node = never_registered
try:
    hray.ray_start(num_cpus=1, temp_dir=sys.argv[1])
    error = None
except RuntimeError as exc:
    error = str(exc)
stale_store = internal_kv._internal_kv_initialized()
left = len(hray._ray_children())
PopulationBasedTraining(time_attr="training_iteration", perturbation_interval=2, hyperparam_mutations={"lr": [0.1, 0.2]})
print(json.dumps({"error": error, "stale_store": stale_store, "ray_processes_left": left, "scheduler_made": True}))
