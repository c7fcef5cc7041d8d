"""A tiny Ray Tune run with Population Based Training on the local Ray that ``hpo.ray_start`` starts
(tests/test_hpo_ray.py): PBT restarts trials from checkpoints. Usage: ``ray_tune_pbt.py TMP_DIR``; prints one JSON line.
"""
import json
import sys
import tempfile
from pathlib import Path

import ray
from ray import tune
from ray.tune.schedulers import PopulationBasedTraining

from dlo.lessons import hpo

out = Path(sys.argv[1]).resolve()
#: One epoch past PBT's last perturbation (at 2 and 4): every trial's last result then comes from its own run after
#: any exploit. With 4 epochs a trial exploited at its last epoch restarts from the donor's final checkpoint and ends
#: without a result of its own, and on a busy machine its epoch-4 result was once left out, one trial short.
EPOCHS = 5


def trainable(config):
    start, value = 0, 0.0
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            start, value = json.loads((Path(folder) / "state.json").read_text())
    for step in range(start, EPOCHS):
        value += config["lr"]
        with tempfile.TemporaryDirectory() as folder:
            (Path(folder) / "state.json").write_text(json.dumps([step + 1, value]))
            tune.report({"score": value, "epoch": step + 1}, checkpoint=tune.Checkpoint.from_directory(folder))


info = hpo.ray_start(num_cpus=2, temp_dir=out / "ray")
try:
    # synchronous, as hpo.ipynb: both trials are ranked at epochs 2 and 4, so the worse one copies the better one
    # however the two are scheduled (together, or one after the other on a busy machine)
    pbt = PopulationBasedTraining(time_attr="training_iteration", perturbation_interval=2, synch=True,
                                  hyperparam_mutations={"lr": tune.uniform(0.0, 1.0)})
    progress = hpo.tune_progress(2, "test", metrics=("score", "epoch"))
    tuner = tune.Tuner(tune.with_resources(trainable, {"cpu": 1}), param_space={"lr": tune.uniform(0.0, 1.0)},
                       tune_config=tune.TuneConfig(metric="score", mode="max", scheduler=pbt, num_samples=2,
                                                   reuse_actors=True),
                       run_config=tune.RunConfig(name="pbt", storage_path=str(out), verbose=0, callbacks=[progress],
                                                 checkpoint_config=tune.CheckpointConfig(num_to_keep=4)))
    grid = tuner.fit()
    row = hpo.ray_summary(progress.records, grid, 1.0, "pbt", max_epochs=EPOCHS, metric="score")
    trials = {r["trial"] for r in progress.records}
    record = {"num_cpus": info["num_cpus"], "seconds": info["seconds"], "attempts": info["attempts"],
              "errors": grid.num_errors, "trials": len(grid), "complete": row["complete"],
              "epochs_trained": row["epochs trained"], "recorded_trials": len(trials),
              "recorded_trials_in_results": sum(any(t in Path(r.path).name for r in grid) for t in trials),
              "exploits": len(hpo.pbt_exploits(out / "pbt")),
              "exploit_lr_floats": all(isinstance(e["lr after"], float) for e in hpo.pbt_exploits(out / "pbt"))}
finally:
    ray.shutdown()
record["initialized_after_shutdown"] = ray.is_initialized()
print(json.dumps(record))
