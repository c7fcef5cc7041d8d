"""dlo.lessons.hpo: toy functions, search spaces (and the duplicated-name pitfall), journal storage shared by
processes and resumed, the small CIFAR trainer, Ray helpers, the Ray Tune Slurm template."""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

import dlo  # noqa: F401  (before torchvision: prepares its import)
from dlo.lessons import hpo
from dlo.runtime.paths import ROOT
import dlo.lessons.hpo.ray
from test_slurm import sbatch_options  # the #SBATCH header as sbatch reads it

optuna = pytest.importorskip("optuna")
optuna.logging.set_verbosity(optuna.logging.WARNING)

BASH = shutil.which("bash")
SBATCH = ROOT / "slurm" / "ray_tune.sbatch"
LR = {"type": "float", "low": 1e-4, "high": 1.0, "log": True}


# --------------------------------------------------------------------------------------------------
# Toy functions
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(hpo.TOY_FUNCTIONS))
def test_toy_minima_are_zero_and_inside_the_box(name):
    fn = hpo.toy_function(name)
    for x, y in fn.minima:
        assert fn(x, y) == pytest.approx(0, abs=1e-8)
        assert fn.bounds["x"][0] <= x <= fn.bounds["x"][1] and fn.bounds["y"][0] <= y <= fn.bounds["y"][1]
    assert fn(0.0, 0.0) > 0.5


def test_toy_grid_and_unknown_function():
    grid = hpo.toy_function("rosenbrock").grid(36)
    assert [len(v) for v in grid.values()] == [6, 6] and grid["x"][0] == -2 and grid["x"][-1] == 2
    with pytest.raises(ValueError, match="unknown toy function 'sphere'"):
        hpo.toy_function("sphere")
    with pytest.raises(ValueError, match="n_trials >= 4"):
        hpo.toy_function("rosenbrock").grid(3)


def test_tpe_beats_nothing_on_rosenbrock_seeded():
    """Same seed, same trials: a study is reproducible, which the notebook's comparisons rely on."""
    fn = hpo.toy_function("rosenbrock")
    best = []
    for _ in range(2):
        study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=3))
        study.optimize(fn.objective, n_trials=20)
        best.append(study.best_value)
    assert best[0] == best[1] and set(study.best_params) == {"x", "y"}


def test_best_so_far():
    assert hpo.best_so_far([3.0, None, 1.0, 2.0]) == [3.0, 3.0, 1.0, 1.0]
    assert hpo.best_so_far([0.1, 0.3, 0.2], "maximize") == [0.1, 0.3, 0.3]
    assert math.isnan(hpo.best_so_far([None, 1.0])[0])
    with pytest.raises(ValueError, match="direction"):
        hpo.best_so_far([1.0], "min")


# --------------------------------------------------------------------------------------------------
# Search spaces and the duplicated-name pitfall
# --------------------------------------------------------------------------------------------------

def test_duplicated_name_silently_ties_two_parameters_in_optuna():
    """The pitfall, pinned: Optuna returns the first value for a name asked twice, without a warning."""
    import warnings

    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning either
        for _ in range(10):
            trial = study.ask()
            lr = trial.suggest_float("lr", 1e-4, 1.0, log=True)
            weight_decay = trial.suggest_float("lr", 1e-4, 1.0, log=True)
            assert weight_decay == lr
            assert list(trial.params) == ["lr"]
            study.tell(trial, 0.0)


def test_strict_trial_raises_on_a_name_asked_twice():
    trial = hpo.StrictTrial(optuna.create_study().ask())
    trial.suggest_float("lr", 1e-4, 1.0, log=True)
    trial.suggest_int("layers", 1, 4)
    with pytest.raises(hpo.DuplicateParameterError, match="'lr' is sampled twice"):
        trial.suggest_float("lr", 1e-4, 1.0, log=True)
    assert trial.number == 0 and set(trial.params) == {"lr", "layers"}  # everything else is forwarded


def test_suggest_uses_one_name_per_parameter():
    space = {"lr": LR, "weight_decay": {"type": "float", "low": 1e-6, "high": 1e-2, "log": True},
             "layers": {"type": "int", "low": 1, "high": 8, "step": 1},
             "optimizer": {"type": "categorical", "choices": ["sgd", "adamw"]}}
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    for _ in range(10):
        trial = study.ask()
        values = hpo.suggest(trial, space)
        assert values == trial.params and set(values) == set(space)
        study.tell(trial, 0.0)
    assert len({t.params["lr"] - t.params["weight_decay"] for t in study.trials}) == 10
    assert trial.distributions == hpo.to_optuna(space)


@pytest.mark.parametrize("space, message", [
    ([("lr", LR), ("lr", LR)], "parameter 'lr' is defined twice"),
    ({"lr": {"type": "float", "low": 0.1, "high": 0.01}}, "empty range: low=0.1 >= high=0.01"),
    ({"lr": {"type": "float", "low": 0.1, "high": 0.1}}, "empty range"),
    ({"wd": {"type": "float", "low": 0.0, "high": 1e-2, "log": True}}, "log scale needs low > 0"),
    ({"wd": {"type": "int", "low": -1, "high": 4, "log": True}}, "log scale needs low > 0"),
    ({"lr": {"type": "loguniform", "low": 1e-4, "high": 1.0}}, "unknown type 'loguniform'"),
    ({"lr": {"low": 1e-4, "high": 1.0}}, "unknown type None"),
    ({"lr": {"type": "float", "low": 1e-4, "high": 1.0, "logscale": True}}, "unknown key"),
    ({"lr": {"type": "float", "low": 1e-4}}, "needs both 'low' and 'high'"),
    ({"lr": {"type": "float", "low": "a", "high": 1.0}}, "finite numbers"),
    ({"lr": {"type": "float", "low": 1e-4, "high": 1.0, "log": True, "step": 0.1}}, "cannot be combined"),
    ({"n": {"type": "int", "low": 1.5, "high": 4}}, "must be integers"),
    ({"opt": {"type": "categorical", "choices": []}}, "non-empty list"),
    ({"opt": {"type": "categorical", "choices": ["sgd", "sgd"]}}, "lists a value twice"),
    ({"": LR}, "non-empty strings"),
    ({}, "it is empty"),
    (42, "give a dict"),
    ({"lr": 0.1}, "its spec must be a dict"),
])
def test_invalid_search_spaces_give_one_clear_line(space, message):
    with pytest.raises(hpo.SearchSpaceError) as info:
        hpo.validate_space(space)
    text = str(info.value)
    assert message in text and "\n" not in text and text.startswith("invalid search space")


def test_json_space_with_a_key_written_twice():
    text = '{"lr": {"type": "float", "low": 1e-4, "high": 1}, "lr": {"type": "int", "low": 1, "high": 4}}'
    assert json.loads(text) == {"lr": {"type": "int", "low": 1, "high": 4}}  # what json.loads alone does
    with pytest.raises(hpo.SearchSpaceError, match="key 'lr' appears twice in the JSON"):
        hpo.parse_space_json(text)
    with pytest.raises(hpo.SearchSpaceError, match="not valid JSON"):
        hpo.parse_space_json("{lr: 1}")
    assert hpo.parse_space_json('{"lr": {"type": "float", "low": 1e-4, "high": 1, "log": true}}')["lr"]["log"] is True


def test_to_ray_domains_match_the_space():
    pytest.importorskip("ray.tune")
    from ray.tune.search.sample import Categorical, Float, Integer

    space = {"lr": LR, "momentum": {"type": "float", "low": 0.0, "high": 0.99},
             "layers": {"type": "int", "low": 1, "high": 4}, "opt": {"type": "categorical", "choices": ["a", "b"]}}
    dom = hpo.to_ray(space)
    assert isinstance(dom["lr"], Float) and (dom["lr"].lower, dom["lr"].upper) == (1e-4, 1.0)
    assert type(dom["lr"].get_sampler()).__name__ == "_LogUniform"
    assert isinstance(dom["layers"], Integer) and (dom["layers"].lower, dom["layers"].upper) == (1, 5)  # upper excluded
    assert isinstance(dom["opt"], Categorical) and dom["opt"].categories == ["a", "b"]
    draws = [dom["layers"].sample() for _ in range(200)]
    assert set(draws) == {1, 2, 3, 4}  # both bounds reachable, as in Optuna


# --------------------------------------------------------------------------------------------------
# Journal storage: several processes, one study, resumed
# --------------------------------------------------------------------------------------------------

def test_journal_storage_rejects_unusable_paths(tmp_path):
    (tmp_path / "file").write_text("x")
    for bad, message in [(tmp_path / "file" / "journal.log", "is not writable"),
                         (tmp_path / "missing" / "journal.log", "does not exist"),
                         (tmp_path, "is a folder")]:
        with pytest.raises(hpo.JournalPathError, match=message) as info:
            hpo.journal_storage(bad)
        assert "\n" not in str(info.value)
    with pytest.raises(hpo.JournalPathError, match="must be a file path"):
        hpo.journal_storage(None)


def test_journal_storage_in_a_read_only_folder(as_unprivileged, read_only_folder):
    ro, rw = read_only_folder

    def attempt(folder):
        def fn():
            try:
                hpo.journal_storage(folder / "journal.log")
            except hpo.JournalPathError as exc:
                return str(exc)
            return None
        return as_unprivileged(fn)

    message = attempt(ro)
    assert message is not None and "not writable" in message and "\n" not in message
    assert attempt(rw) is None  # the control: the same user may write a writable folder


@pytest.mark.distributed
def test_two_worker_processes_share_a_study_then_it_resumes(tmp_path):
    journal = tmp_path / "journal.log"
    optuna.create_study(study_name="shared", storage=hpo.journal_storage(journal))
    summaries = hpo.launch_workers(journal, "shared", n_workers=2, n_trials=6, function="himmelblau", seed=5,
                                   sleep_s=0.02)
    assert [s["trials"] for s in summaries] == [6, 6] and len({s["pid"] for s in summaries}) == 2
    assert [s["seed"] for s in summaries] == [5, 6]  # each worker its own sampler seed
    study = optuna.load_study(study_name="shared", storage=hpo.journal_storage(journal))
    trials = study.trials
    assert len(trials) == 12 and sorted(t.number for t in trials) == list(range(12))
    assert sorted(t.user_attrs["worker"] for t in trials) == [0] * 6 + [1] * 6
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    # "restart": new storage object, same file, same study; more trials on top
    resumed = optuna.load_study(study_name="shared", storage=hpo.journal_storage(journal))
    resumed.optimize(hpo.toy_function("himmelblau").objective, n_trials=3)
    assert len(optuna.load_study(study_name="shared", storage=hpo.journal_storage(journal)).trials) == 15


def test_worker_command_line_errors_are_one_line(tmp_path, capsys):
    code = hpo.main(["worker", "--journal", str(tmp_path / "nope" / "j.log"), "--study", "s"])
    assert code == 2 and capsys.readouterr().err.strip().splitlines() == [
        f"error: journal file {tmp_path / 'nope' / 'j.log'} is not writable (its folder {tmp_path / 'nope'} does not "
        "exist): give a file in a folder you can write to (on a cluster: a shared file system such as $WORK or "
        "$SCRATCH)"]
    code = hpo.main(["worker", "--journal", str(tmp_path / "j.log"), "--study", "s", "--function", "sphere"])
    assert code == 2 and "unknown toy function 'sphere'" in capsys.readouterr().err
    code = hpo.main(["worker", "--journal", str(tmp_path / "j.log"), "--study", "s", "--n-trials", "0"])
    assert code == 2 and "--n-trials must be >= 1" in capsys.readouterr().err
    # the real command line, in its own process
    res = subprocess.run([sys.executable, "-m", "dlo", "hpo", "worker", "--journal", str(tmp_path / "j.log"), "--study",
                          "absent"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [
        f"error: no study 'absent' in {tmp_path / 'j.log'}: create it first (optuna.create_study(storage=..., "
        "study_name='absent'))"]


def test_launch_workers_reports_a_failing_worker(tmp_path):
    journal = tmp_path / "journal.log"
    hpo.journal_storage(journal)
    with pytest.raises(RuntimeError, match=r"worker 0 failed \(exit 2\): error: no study 'missing'"):
        hpo.launch_workers(journal, "missing", n_workers=1, n_trials=1)


# --------------------------------------------------------------------------------------------------
# The small CIFAR training
# --------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_data():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(96, 3, 32, 32, generator=gen)
    y = torch.randint(0, 10, (96,), generator=gen)
    x[y < 5, 0] += 1.0  # something to learn
    return {"x_train": x[:64], "y_train": y[:64], "x_val": x[64:], "y_val": y[64:]}


def test_trainer_builds_the_narrow_resnet(tiny_data):
    from dlo.models import CifarResNet18

    trainer = hpo.Trainer({"lr": 0.1}, tiny_data, arch="resnet", width=2)
    assert isinstance(trainer.model, CifarResNet18) and trainer.model.conv1.out_channels == 2


def test_trainer_epochs_and_checkpoint_roundtrip(tiny_data):
    kw = dict(arch="mlp", width=16, batch_size=16, seed=1)
    a = hpo.Trainer({"lr": 0.05, "momentum": 0.5}, tiny_data, **kw)
    acc = a.train_epoch()
    assert isinstance(acc, float) and 0.0 <= acc <= 1.0 and a.epoch == 1
    state = a.state_dict()
    b = hpo.Trainer({"lr": 0.05, "momentum": 0.5}, tiny_data, **kw)
    b.load_state_dict(state)
    assert b.epoch == 1 and a.train_epoch() == b.train_epoch()  # same weights, optimiser state and shuffling
    b.set_hparams({"lr": 0.01})
    assert b.optimizer.param_groups[0]["lr"] == 0.01 and b.config["momentum"] == 0.5


def test_trainer_rejects_unknown_hyperparameters(tiny_data):
    with pytest.raises(ValueError, match="unknown hyper-parameter\\(s\\) 'learning_rate'"):
        hpo.Trainer({"learning_rate": 0.1}, tiny_data)
    with pytest.raises(ValueError, match="needs 'lr'"):
        hpo.Trainer({"momentum": 0.9}, tiny_data)
    with pytest.raises(ValueError, match="unknown arch"):
        hpo.Trainer({"lr": 0.1}, tiny_data, arch="vit")
    with pytest.raises(ValueError, match="data lacks x_val"):
        hpo.Trainer({"lr": 0.1}, {k: v for k, v in tiny_data.items() if k != "x_val"})


def test_study_summary_counts_pruned_trials_and_epochs():
    study = optuna.create_study(direction="maximize", pruner=optuna.pruners.ThresholdPruner(lower=0.5))

    def objective(trial):
        x = trial.suggest_float("x", 0, 1)
        for step in (1, 2, 3):
            trial.report(x, step)
            if trial.should_prune():
                raise optuna.TrialPruned()
        return x

    study.enqueue_trial({"x": 0.9})
    study.enqueue_trial({"x": 0.1})
    study.optimize(objective, n_trials=2)
    row = hpo.study_summary(study, 1.5, "t")
    assert (row["trials"], row["complete"], row["pruned"], row["epochs trained"]) == (2, 1, 1, 4)
    assert row["best value"] == 0.9 and row["wall time (s)"] == 1.5


def test_ray_summary_from_records():
    class Grid:
        num_errors = 0

        def __len__(self):
            return 3

    records = [{"trial": "a", "epoch": e, "accuracy": 0.1 * e} for e in (1, 2, 3)]
    records += [{"trial": "b", "epoch": 1, "accuracy": 0.5}]
    records += [{"trial": "c", "epoch": e, "accuracy": 0.2} for e in (1, 2, 3)]
    row = hpo.ray_summary(records, Grid(), 2.0, "ray", max_epochs=3)
    assert (row["complete"], row["pruned"], row["epochs trained"]) == (2, 1, 7)
    assert row["best value"] == pytest.approx(0.3)  # b's 0.5 came from a trial stopped early


def test_pbt_exploits_reads_the_log(tmp_path):
    line = ["1_lr=0.0001", "3_lr=0.5", 3, 2, {"lr": 0.5}, {"lr": 0.6}]
    (tmp_path / "pbt_global.txt").write_text(json.dumps(line) + "\n")
    assert hpo.pbt_exploits(tmp_path) == [{"trial": "1", "copied from": "3", "at iteration": 3, "from iteration": 2,
                                           "lr before": 0.5, "lr after": 0.6}]
    assert hpo.pbt_exploits(tmp_path / "none") == []


# --------------------------------------------------------------------------------------------------
# Ray
# --------------------------------------------------------------------------------------------------

def test_ray_temp_dir_stays_short_enough_for_unix_sockets(tmp_path):
    short = hpo.ray_temp_dir("/tmp/dlo-r")
    long = hpo.ray_temp_dir(tmp_path / ("x" * 80))
    for path in (short, long):
        assert len(str(path)) + dlo.lessons.hpo.ray._SESSION_TAIL <= dlo.lessons.hpo.ray._SOCKET_MAX
    assert short == Path("/tmp/dlo-r").resolve() and long.parent == Path(tempfile.gettempdir())
    assert not short.exists()  # only a name: ray_start creates it


def test_a_half_started_ray_is_stopped_before_retrying():
    """After a failed ray.init, only this process's Ray children are stopped (none of its other children)."""
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    ray_like = subprocess.Popen([*sleep, "/venv/site-packages/ray/_private/log_monitor.py"])
    other = subprocess.Popen([*sleep, "/data/array/x"])
    try:
        dlo.lessons.hpo.ray._stop_ray_children()
        assert ray_like.wait(timeout=10) is not None
        assert other.poll() is None
    finally:
        for proc in (ray_like, other):
            proc.kill()
            proc.wait()


# Starting a Ray (Tune with PBT, what it listens on, a failed start): tests/test_hpo_ray.py, each in its own Python


# --------------------------------------------------------------------------------------------------
# slurm/ray_tune.sbatch
# --------------------------------------------------------------------------------------------------

@pytest.mark.skipif(BASH is None, reason="bash not installed")
def test_ray_tune_sbatch_is_valid_bash_with_head_and_worker_logic():
    res = subprocess.run([BASH, "-n", str(SBATCH)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    text = SBATCH.read_text()
    assert text.startswith("#!/bin/bash\n") and "set -euo pipefail" in text
    opts = sbatch_options(text)
    assert opts["--ntasks-per-node"] == "1" and opts["--output"] == "runs/slurm/%x-%j.out"
    for key in ("--job-name", "--nodes", "--gpus-per-node", "--cpus-per-task", "--time"):
        assert key in opts
    # head on the first node, then one worker per other node, all through srun, each with the node's resources
    assert 'HEAD=${NODES[0]}' in text and 'for node in "${NODES[@]:1}"' in text
    head = text.index("ray start --head")
    worker = text.index('ray start --address="$RAY_ADDRESS"')
    assert head < worker
    assert '--num-cpus="$CPUS"' in text and '--num-gpus="$GPUS"' in text and "SLURM_CPUS_PER_TASK" in text
    assert text.count('srun "${STEP[@]}" -w') == 2 and "--block" in text
    # waits for the head and for every node before the driver; exports the address; stops Ray at the end
    assert "ray status" in text and 'ray.nodes()' in text and "export RAY_ADDRESS=" in text
    assert "dlo run" in text and "ray stop" in text and "trap stop_ray EXIT" in text
    assert "RAY_AUTH_MODE=token" in text and "RAY_USAGE_STATS_ENABLED=0" in text


@pytest.mark.skipif(BASH is None, reason="bash not installed")
def test_ray_tune_sbatch_argument_errors_are_one_line(tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "srun").write_text("#!/bin/sh\nexit 0\n")
    (fake / "srun").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["DLO_ROOT"] = str(ROOT)

    def run(*args, slurm=True):
        e = dict(env, PATH=f"{fake}:{env['PATH']}", SLURM_JOB_ID="42") if slurm else env
        return subprocess.run([BASH, str(SBATCH), *args], capture_output=True, text=True, env=e, timeout=60)

    res = run("Jour4/hpo.ipynb", slurm=False)
    assert res.returncode == 2 and res.stderr.strip().startswith("error: not inside a Slurm job")
    res = run()
    assert res.returncode == 2 and res.stderr.strip().startswith("error: no driver given")
    res = run("Jour4/nope.ipynb")
    assert res.returncode == 2 and "error: driver 'Jour4/nope.ipynb' not found" in res.stderr
    res = run("README.md")
    assert res.returncode == 2 and "neither a notebook (.ipynb) nor a Python script (.py)" in res.stderr


# --------------------------------------------------------------------------------------------------
# Stepped parameters: the same values for Optuna and Ray; PBT's explore step stays inside the space
# --------------------------------------------------------------------------------------------------

from dlo.lessons.hpo.space import clip_to_space, grid  # noqa: E402

STEPPED = {"odd": {"type": "int", "low": 1, "high": 9, "step": 2},
           "tenths": {"type": "float", "low": 0.1, "high": 1.0, "step": 0.1},
           "offset": {"type": "float", "low": 0.05, "high": 0.95, "step": 0.15}}


def optuna_values(name, spec, n=400):
    """The set of values Optuna's random sampler draws for one parameter."""
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    values = set()
    for _ in range(n):
        trial = study.ask()
        values.add(hpo.suggest(trial, {name: spec})[name])
        study.tell(trial, 0.0)
    return values


@pytest.mark.parametrize("name", list(STEPPED))
def test_stepped_parameters_have_the_same_values_in_optuna_and_ray(name):
    pytest.importorskip("ray.tune")
    spec = STEPPED[name]
    expected = set(grid(hpo.validate_space({name: spec})[name]))
    assert optuna_values(name, spec) == expected
    dom = hpo.to_ray({name: spec})[name]
    assert set(dom.categories) == expected
    assert {dom.sample() for _ in range(300)} == expected
    if name == "odd":
        assert expected == {1, 3, 5, 7, 9}  # Ray's qrandint(1, 9, 2) gave {2, 4, 6, 8}


@pytest.mark.parametrize("spec", [{"type": "float", "low": 0.0, "high": 1.0, "step": 0.3},
                                  {"type": "int", "low": 1, "high": 10, "step": 2},
                                  {"type": "float", "low": 0.1, "high": 0.95, "step": 0.1}])
def test_a_step_that_does_not_divide_the_range_is_rejected_in_one_line(spec):
    with pytest.raises(hpo.SearchSpaceError) as info:
        hpo.validate_space({"x": spec})
    text = str(info.value)
    assert "does not divide the range" in text and "\n" not in text and text.startswith("invalid search space")


def test_clip_to_space():
    space = {"momentum": {"type": "float", "low": 0.0, "high": 0.99}, "lr": LR, **STEPPED,
             "opt": {"type": "categorical", "choices": ["sgd", "adamw"]}}
    config = {"momentum": 1.08, "lr": 1.2, "odd": 4.2, "tenths": 0.47, "offset": -3.0, "opt": "sgd", "other": 7}
    assert clip_to_space(config, space) == {
        "momentum": 0.99, "lr": 1.0, "odd": 5, "tenths": grid(hpo.validate_space(STEPPED)["tenths"])[4],
        "offset": 0.05, "opt": "sgd", "other": 7}


def test_pbt_explore_keeps_every_mutation_inside_the_space():
    """Ray's explore step multiplies by 0.8 or 1.2 without bounds: from momentum 0.9, a third of the steps
    gave 1.08, which the trainer rejects. With pbt_mutations + KeepInSpace every explored config is valid."""
    pytest.importorskip("ray.tune")
    import random

    from ray.tune.schedulers.pbt import _explore

    from dlo.lessons.hpo import ray as hray

    space = {"lr": LR, "momentum": {"type": "float", "low": 0.0, "high": 0.99}, "odd": STEPPED["odd"],
             "tenths": STEPPED["tenths"]}
    start = {"lr": 0.9, "momentum": 0.9, "odd": 9, "tenths": 1.0}
    random.seed(0)
    plain = [_explore(start, hpo.to_ray({k: space[k] for k in ("lr", "momentum")}), 0.25, (1.2, 0.8), None)[0]
             for _ in range(300)]
    rejected = sum(not 0 <= c["momentum"] < 1 for c in plain)
    assert 60 < rejected < 140  # the bug: about a third
    explored = [_explore(start, hray.pbt_mutations(space), 0.25, (1.2, 0.8), hray.KeepInSpace(space))[0]
                for _ in range(300)]
    values = {k: set() for k in space}
    for c in explored:
        hpo.Trainer._check_config({"lr": c["lr"], "momentum": c["momentum"]})  # raises on a rejected config
        assert 1e-4 <= c["lr"] <= 1.0 and 0.0 <= c["momentum"] <= 0.99
        assert c["odd"] in {1, 3, 5, 7, 9} and c["tenths"] in grid(hpo.validate_space(space)["tenths"])
        for k in space:
            values[k].add(c[k])
    assert 0.99 in values["momentum"] and len(values["momentum"]) > 2  # clipped at the bound, and explored
    assert values["odd"] - {9} and values["tenths"] - {1.0}  # the stepped values move too
    pbt = hray.pbt_scheduler(space, time_attr="training_iteration", perturbation_interval=2)
    assert isinstance(pbt._custom_explore_fn, hray.KeepInSpace)
    assert pbt._hyperparam_mutations["odd"] == [1, 3, 5, 7, 9]
    with pytest.raises(ValueError, match="sets hyperparam_mutations itself"):
        hray.pbt_scheduler(space, hyperparam_mutations={})


def test_a_killed_workers_running_trial_is_failed_on_resume(tmp_path):
    """A worker killed mid-trial leaves its trial RUNNING (a journal has no heartbeat); resuming fails it, and only
    it: a running trial of a live process (this one) and finished trials are left alone."""
    import socket
    import subprocess

    import optuna
    from optuna.trial import TrialState

    from dlo.lessons.hpo.journal import fail_dead_trials, journal_storage

    storage = journal_storage(tmp_path / "journal.log")
    study = optuna.create_study(study_name="s", storage=storage)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    killed = study.ask()
    killed.set_user_attr("host", socket.gethostname())
    killed.set_user_attr("pid", dead.pid)
    alive = study.ask()
    alive.set_user_attr("host", socket.gethostname())
    alive.set_user_attr("pid", os.getpid())
    other_host = study.ask()
    other_host.set_user_attr("host", "another-node")
    other_host.set_user_attr("pid", dead.pid)
    done = study.ask()
    study.tell(done, 1.0)
    assert fail_dead_trials(storage, "s") == [killed.number]
    states = {t.number: t.state for t in optuna.load_study(study_name="s", storage=journal_storage(tmp_path / "journal.log")).trials}
    assert states == {killed.number: TrialState.FAIL, alive.number: TrialState.RUNNING,
                      other_host.number: TrialState.RUNNING, done.number: TrialState.COMPLETE}
    assert fail_dead_trials(storage, "s") == []  # idempotent


def test_journal_lock_of_a_dead_writer_is_broken_after_the_grace_period(tmp_path):
    from dlo.lessons.hpo.journal import LOCK_GRACE_S, journal_storage

    storage = journal_storage(tmp_path / "journal.log")
    assert storage._backend._lock.grace_period == LOCK_GRACE_S < 30


def test_ray_folder_and_token_are_private_from_the_start(tmp_path, monkeypatch):
    """Ray's session folder is 0700 and its token 0600 as created (never a moment world-readable); a token others
    could read is replaced; a folder of another user is refused in one line."""
    import stat as st

    from dlo.lessons.hpo.ray import private_dir, private_token

    created = []
    real_open = os.open

    def spy_open(path, flags, mode=0o777, *a, **k):
        created.append((str(path), mode))
        return real_open(path, flags, mode, *a, **k)

    folder = private_dir(tmp_path / "ray")
    assert st.S_IMODE(folder.stat().st_mode) == 0o700
    monkeypatch.setattr(os, "open", spy_open)
    token = private_token(folder / "auth_token")
    monkeypatch.undo()
    assert created == [(str(folder / "auth_token"), 0o600)]  # created with the final mode, not chmod'ed after
    assert st.S_IMODE(token.stat().st_mode) == 0o600
    first = token.read_text()
    assert private_token(token).read_text() == first  # a private token is kept
    token.chmod(0o644)
    assert private_token(token).read_text() != first and st.S_IMODE(token.stat().st_mode) == 0o600
    (tmp_path / "wide").mkdir(mode=0o777)
    (tmp_path / "wide").chmod(0o777)
    assert st.S_IMODE(private_dir(tmp_path / "wide").stat().st_mode) == 0o700
    monkeypatch.setattr(os, "getuid", lambda: os.stat(tmp_path).st_uid + 1)  # as if another user had made it
    with pytest.raises(PermissionError, match="belongs to another user"):
        private_dir(tmp_path / "ray")


# --------------------------------------------------------------------------------------------------
# Trials are scored on validation images held out of the TRAINING split; the test split is for the final report
# --------------------------------------------------------------------------------------------------

def _rows_in(x, pool):
    """For each image of ``x``, its index in ``pool`` (exact equality), or None when it is not there."""
    flat_pool = pool.flatten(1)
    out = []
    for row in x.flatten(1):
        hits = (flat_pool == row).all(dim=1).nonzero().flatten().tolist()
        out.append(hits[0] if hits else None)
    return out


def test_trial_data_come_from_the_training_split_only(tmp_path):
    from dlo import data

    data.make_generated_cifar10(tmp_path, 200, 60, seed=3)
    trial = hpo.load_cifar_tensors(40, 20, tmp_path, verbose=False)
    assert sorted(trial) == sorted(hpo.TRIAL_KEYS)
    train = data.cifar10("train", tmp_path, data.test_transform(), verbose=False)
    test = data.cifar10("test", tmp_path, data.test_transform(), verbose=False)
    train_x = torch.stack([train[i][0] for i in range(len(train))])
    test_x = torch.stack([test[i][0] for i in range(len(test))])
    train_idx, val_idx = data.split_indices(200, 20)
    assert _rows_in(trial["x_val"], train_x) == val_idx  # the held-out images of the training split...
    assert _rows_in(trial["x_train"], train_x) == train_idx[:40]  # ... never trained on
    assert not set(val_idx) & set(train_idx[:40])
    assert _rows_in(torch.cat([trial["x_train"], trial["x_val"]]), test_x) == [None] * 60  # no test image
    assert trial["y_val"].tolist() == [train.targets[i] for i in val_idx]
    final = hpo.load_cifar_test_tensors(30, tmp_path, n_train=40, n_val=20)
    assert _rows_in(final["x_test"], test_x) == list(range(30))


def test_a_trial_never_sees_a_test_sample(tiny_data):
    """Every image the model is run on during a trial (training and scoring) is a training-split image."""
    gen = torch.Generator().manual_seed(7)
    x_test = torch.randn(16, 3, 32, 32, generator=gen) + 5.0
    with pytest.raises(ValueError, match="a trial gets only x_train, y_train, x_val, y_val"):
        hpo.Trainer({"lr": 0.1}, {**tiny_data, "x_test": x_test, "y_test": torch.zeros(16, dtype=torch.long)})
    trainer = hpo.Trainer({"lr": 0.05}, tiny_data, arch="mlp", width=8, batch_size=16)
    seen = []
    trainer.model.register_forward_pre_hook(lambda module, args: seen.append(args[0].detach().clone()))
    trainer.train_epoch()
    allowed = torch.cat([tiny_data["x_train"], tiny_data["x_val"]])
    inputs = torch.cat(seen)
    assert len(inputs) == 64 + 32  # one epoch of training images, then the validation images once
    assert None not in _rows_in(inputs, allowed)
    assert _rows_in(inputs, x_test) == [None] * len(inputs)
    assert 0.0 <= trainer.accuracy(x_test, torch.zeros(16, dtype=torch.long)) <= 1.0  # the final report, by hand


def test_a_worker_killed_as_soon_as_its_trial_runs_leaves_a_trial_that_resume_fails(tmp_path):
    """The notebook's scene, for real: a `dlo hpo worker` process SIGKILLed the moment a RUNNING trial of its appears
    in the journal. Its owner (host, pid) was written with the trial, so fail_dead_trials fails exactly that trial
    (with study.optimize, the owner was recorded a moment after the trial became RUNNING: a kill in between left a
    trial nothing could clean, and the notebook printed "marked [] FAILED")."""
    import signal
    import subprocess
    import time

    import optuna
    from optuna.trial import TrialState

    from dlo.lessons.hpo.journal import fail_dead_trials, journal_storage

    journal = tmp_path / "journal.log"
    storage = journal_storage(journal)
    optuna.create_study(study_name="k", storage=storage)
    worker = subprocess.Popen([sys.executable, "-m", "dlo", "hpo", "worker", "--journal", str(journal), "--study", "k",
                               "--n-trials", "5", "--sleep", "60", "--seed", "0"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        study = optuna.load_study(study_name="k", storage=storage)
        deadline = time.monotonic() + 240
        while not study.get_trials(states=(TrialState.RUNNING,)) and time.monotonic() < deadline:
            assert worker.poll() is None, worker.stderr.read().decode()
            time.sleep(0.02)
        worker.send_signal(signal.SIGKILL)
    finally:
        worker.kill()
        worker.wait()
    running = [t.number for t in study.get_trials(states=(TrialState.RUNNING,))]
    assert running, "the worker never started a trial"
    # deterministic part: the record that creates each trial already names its owner (no window for a kill)
    created = [json.loads(line) for line in journal.read_text().splitlines() if '"op_code":4' in line]
    assert created and all(r["user_attrs"].get("pid") == worker.pid for r in created), created
    assert fail_dead_trials(storage, "k") == running
    assert {t.state for t in optuna.load_study(study_name="k", storage=storage).trials} == {TrialState.FAIL}
