"""Helpers of the hyper-parameter search notebook (Jour4/hpo.ipynb): Optuna and Ray Tune, sized for a CPU.

- :data:`TOY_FUNCTIONS`: Rosenbrock and Himmelblau, two cheap 2-D functions with known minima, to watch
  how samplers (grid, random, TPE, CMA-ES, ...) spend a budget of trials.
- Search spaces: :func:`validate_space` checks a definition ``{name: spec}`` before anything is
  sampled (one clear error for a duplicated name, an empty range, a log scale that reaches 0, an
  unknown type), :func:`suggest` samples it on an Optuna trial, :func:`to_optuna` / :func:`to_ray` turn
  it into Optuna distributions or Ray Tune domains, so both libraries search the *same* space.
  :class:`StrictTrial` catches the classic pitfall at run time: two hyper-parameters sampled under
  one name are silently tied together by Optuna (the second call returns the first value).
- :func:`journal_storage`: Optuna's journal file storage, the one that works on the NFS/Lustre file
  systems of clusters, with a clear error when the path is not writable; :func:`launch_workers` starts
  processes that optimise one study together (``python -m dlo.hpo worker ...``).
- :func:`load_cifar_tensors` and :class:`Trainer`: a small CIFAR-10 training (a narrow ResNet-18 or an
  MLP) on tensors held in memory, one epoch per call, with a state for checkpoints (Ray's PBT).
- :func:`ray_start`: ``ray.init`` for a notebook: a fixed number of CPUs, no dashboard, no usage
  statistics sent anywhere, its temporary folder (and its authentication token) in the project's
  ``.cache/`` when the path is short enough for Ray's Unix sockets.
- :func:`tune_progress` records what a Ray Tune run reports (and shows a progress bar), :func:`pbt_exploits`
  reads what Population Based Training did; :func:`study_summary`, :func:`ray_summary` and
  :func:`best_so_far` make the rows and curves of the comparisons.

Command line (the notebook's parallel workers)::

    python -m dlo.hpo worker --journal runs/hpo/journal.log --study toy --function himmelblau --n-trials 20 --seed 1
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .paths import CACHE_DIR, probe_writable

# --------------------------------------------------------------------------------------------------
# Toy functions
# --------------------------------------------------------------------------------------------------


def rosenbrock(x: float, y: float) -> float:
    """``(1 - x)² + 100 (y - x²)²``: one minimum, 0 at (1, 1), at the bottom of a long curved valley."""
    return (1.0 - x) ** 2 + 100.0 * (y - x * x) ** 2


def himmelblau(x: float, y: float) -> float:
    """``(x² + y - 11)² + (x + y² - 7)²``: four minima, all 0, e.g. at (3, 2)."""
    return (x * x + y - 11.0) ** 2 + (x + y * y - 7.0) ** 2


@dataclass(frozen=True)
class ToyFunction:
    """A 2-D function to minimise over a box, with its known minima (value 0)."""

    name: str
    fn: Callable[[float, float], float]
    bounds: Mapping[str, tuple[float, float]]
    minima: tuple[tuple[float, float], ...]

    def __call__(self, x: float, y: float) -> float:
        return self.fn(x, y)

    def objective(self, trial) -> float:
        """The Optuna objective: ``x`` and ``y`` each sampled under its own name, inside the box."""
        x = trial.suggest_float("x", *self.bounds["x"])
        y = trial.suggest_float("y", *self.bounds["y"])
        return self.fn(x, y)

    def grid(self, n_trials: int) -> dict[str, list[float]]:
        """A ``k × k`` grid with ``k = floor(sqrt(n_trials))``, at most ``n_trials`` points (for GridSampler)."""
        if not isinstance(n_trials, int) or isinstance(n_trials, bool) or n_trials < 4:
            raise ValueError(f"a grid needs n_trials >= 4 (2 x 2 points), got {n_trials!r}")
        k = math.isqrt(n_trials)
        return {name: [lo + (hi - lo) * i / (k - 1) for i in range(k)] for name, (lo, hi) in self.bounds.items()}

    def mesh(self, n: int = 150):
        """``(X, Y, Z)`` numpy arrays over the box, for a contour plot."""
        import numpy as np

        (x0, x1), (y0, y1) = self.bounds["x"], self.bounds["y"]
        X, Y = np.meshgrid(np.linspace(x0, x1, n), np.linspace(y0, y1, n))
        return X, Y, self.fn(X, Y)


TOY_FUNCTIONS: dict[str, ToyFunction] = {
    "rosenbrock": ToyFunction("rosenbrock", rosenbrock, {"x": (-2.0, 2.0), "y": (-1.0, 3.0)}, ((1.0, 1.0),)),
    "himmelblau": ToyFunction("himmelblau", himmelblau, {"x": (-5.0, 5.0), "y": (-5.0, 5.0)},
                              ((3.0, 2.0), (-2.805118, 3.131312), (-3.779310, -3.283186), (3.584428, -1.848126))),
}


def toy_function(name: str) -> ToyFunction:
    if name not in TOY_FUNCTIONS:
        raise ValueError(f"unknown toy function {name!r}: choose one of {', '.join(TOY_FUNCTIONS)}")
    return TOY_FUNCTIONS[name]


def best_so_far(values: Iterable[float | None], direction: str = "minimize") -> list[float]:
    """Running best of a sequence of trial values (``None`` = a pruned or failed trial, skipped)."""
    if direction not in ("minimize", "maximize"):
        raise ValueError(f"direction must be 'minimize' or 'maximize', got {direction!r}")
    better = min if direction == "minimize" else max
    out: list[float] = []
    best = math.nan
    for v in values:
        if v is not None and not (isinstance(v, float) and math.isnan(v)):
            best = v if math.isnan(best) else better(best, v)
        out.append(best)
    return out


# --------------------------------------------------------------------------------------------------
# Search spaces: one definition, checked, for Optuna and Ray Tune
# --------------------------------------------------------------------------------------------------


class SearchSpaceError(ValueError):
    """The search space definition is invalid; the message (one line) says which parameter and why."""


_SPEC_KEYS = {
    "float": {"type", "low", "high", "log", "step"},
    "int": {"type", "low", "high", "log", "step"},
    "categorical": {"type", "choices"},
}


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _pairs(space: Any) -> list[tuple[Any, Any]]:
    if isinstance(space, Mapping):
        return list(space.items())
    if isinstance(space, (list, tuple)) and all(isinstance(p, (list, tuple)) and len(p) == 2 for p in space):
        return [tuple(p) for p in space]
    raise SearchSpaceError(f"invalid search space: give a dict {{name: spec}} or a list of (name, spec) pairs, "
                           f"got {type(space).__name__}")


def _check_spec(name: str, spec: Any) -> dict[str, Any]:
    where = f"invalid search space: parameter {name!r}"
    if not isinstance(spec, Mapping):
        raise SearchSpaceError(f"{where}: its spec must be a dict such as "
                               f"{{'type': 'float', 'low': 1e-4, 'high': 1.0, 'log': True}}, got {spec!r}")
    kind = spec.get("type")
    if kind not in _SPEC_KEYS:
        raise SearchSpaceError(f"{where} has unknown type {kind!r}: use 'float', 'int' or 'categorical'")
    unknown = sorted(set(spec) - _SPEC_KEYS[kind])
    if unknown:
        raise SearchSpaceError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))} for type {kind!r}; "
                               f"allowed: {', '.join(sorted(_SPEC_KEYS[kind]))}")
    if kind == "categorical":
        choices = spec.get("choices")
        if not isinstance(choices, (list, tuple)) or len(choices) == 0:
            raise SearchSpaceError(f"{where}: 'choices' must be a non-empty list, got {choices!r}")
        if len(set(map(repr, choices))) != len(choices):
            raise SearchSpaceError(f"{where}: 'choices' lists a value twice: {list(choices)!r}")
        return {"type": "categorical", "choices": list(choices)}
    if "low" not in spec or "high" not in spec:
        raise SearchSpaceError(f"{where} ({kind}) needs both 'low' and 'high'")
    low, high = spec["low"], spec["high"]
    if not (_is_number(low) and _is_number(high)):
        raise SearchSpaceError(f"{where}: low and high must be finite numbers, got low={low!r}, high={high!r}")
    if kind == "int" and not (float(low).is_integer() and float(high).is_integer()):
        raise SearchSpaceError(f"{where} is an int: low and high must be integers, got low={low!r}, high={high!r}")
    if low >= high:
        raise SearchSpaceError(f"{where} has an empty range: low={low!r} >= high={high!r} (low must be below high)")
    log = spec.get("log", False)
    if not isinstance(log, bool):
        raise SearchSpaceError(f"{where}: 'log' must be True or False, got {log!r}")
    if log and low <= 0:
        raise SearchSpaceError(f"{where}: a log scale needs low > 0 (log(0) does not exist), got low={low!r}")
    step = spec.get("step")
    if step is not None:
        if log:
            raise SearchSpaceError(f"{where}: 'step' and 'log' cannot be combined (Optuna allows one or the other)")
        if not _is_number(step) or step <= 0:
            raise SearchSpaceError(f"{where}: 'step' must be a positive number, got {step!r}")
        if kind == "int" and not float(step).is_integer():
            raise SearchSpaceError(f"{where} is an int: 'step' must be an integer, got {step!r}")
    out: dict[str, Any] = {"type": kind, "low": low, "high": high, "log": log}
    if kind == "int":
        out.update(low=int(low), high=int(high))
    if step is not None:
        out["step"] = int(step) if kind == "int" else float(step)
    return out


def validate_space(space: Mapping[str, Mapping] | Sequence[tuple[str, Mapping]]) -> dict[str, dict[str, Any]]:
    """Check a search space and return it as ``{name: normalised spec}``; raise :class:`SearchSpaceError` if invalid.

    ``space`` is a dict ``{name: spec}`` or a list of ``(name, spec)`` pairs (a list built in a loop can
    repeat a name; a dict cannot, but see :func:`parse_space_json` for files). A spec is one of::

        {"type": "float", "low": 1e-4, "high": 1.0, "log": True}        # optional "step" (not with log)
        {"type": "int", "low": 16, "high": 256, "log": True}             # optional "step"
        {"type": "categorical", "choices": ["sgd", "adamw"]}

    Errors, each one line naming the parameter: a name used twice (sampled under one name, two
    hyper-parameters would get the same value), an empty range (``low >= high``), a log scale with
    ``low <= 0``, an unknown type or key, ``step`` with ``log``.
    """
    pairs = _pairs(space)
    if not pairs:
        raise SearchSpaceError("invalid search space: it is empty; define at least one parameter")
    out: dict[str, dict[str, Any]] = {}
    for name, spec in pairs:
        if not isinstance(name, str) or not name.strip():
            raise SearchSpaceError(f"invalid search space: parameter names must be non-empty strings, got {name!r}")
        if name in out:
            raise SearchSpaceError(f"invalid search space: parameter {name!r} is defined twice; each hyper-parameter "
                                   f"needs its own name (sampled under one name, two parameters get the same value)")
        out[name] = _check_spec(name, spec)
    return out


def parse_space_json(text: str) -> dict[str, dict[str, Any]]:
    """A search space from JSON text, validated. A key written twice is an error (``json.loads`` keeps the last one)."""

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for key, value in pairs:
            if key in seen:
                raise SearchSpaceError(f"invalid search space: key {key!r} appears twice in the JSON (json.loads would "
                                       f"silently keep the last one); each hyper-parameter needs its own name")
            seen[key] = value
        return seen

    try:
        raw = json.loads(text, object_pairs_hook=no_duplicates)
    except json.JSONDecodeError as exc:
        raise SearchSpaceError(f"invalid search space: not valid JSON ({exc})") from None
    return validate_space(raw)


def suggest(trial, space: Mapping | Sequence) -> dict[str, Any]:
    """Sample every parameter of ``space`` on an Optuna ``trial``, each under its own name."""
    values: dict[str, Any] = {}
    for name, spec in validate_space(space).items():
        if spec["type"] == "categorical":
            values[name] = trial.suggest_categorical(name, spec["choices"])
        elif spec["type"] == "int":
            values[name] = trial.suggest_int(name, spec["low"], spec["high"], step=spec.get("step", 1), log=spec["log"])
        else:
            values[name] = trial.suggest_float(name, spec["low"], spec["high"], step=spec.get("step"), log=spec["log"])
    return values


def to_optuna(space: Mapping | Sequence) -> dict[str, Any]:
    """``{name: optuna distribution}``, e.g. for ``ray.tune.search.optuna.OptunaSearch(space=...)``."""
    from optuna import distributions as D

    out: dict[str, Any] = {}
    for name, spec in validate_space(space).items():
        if spec["type"] == "categorical":
            out[name] = D.CategoricalDistribution(spec["choices"])
        elif spec["type"] == "int":
            out[name] = D.IntDistribution(spec["low"], spec["high"], log=spec["log"], step=spec.get("step", 1))
        else:
            out[name] = D.FloatDistribution(spec["low"], spec["high"], log=spec["log"], step=spec.get("step"))
    return out


def to_ray(space: Mapping | Sequence) -> dict[str, Any]:
    """``{name: ray.tune domain}``: the same space for ``Tuner(param_space=...)`` and PBT's mutations."""
    from ray import tune

    out: dict[str, Any] = {}
    for name, spec in validate_space(space).items():
        kind, step = spec["type"], spec.get("step")
        if kind == "categorical":
            out[name] = tune.choice(spec["choices"])
        elif kind == "float":
            lo, hi = spec["low"], spec["high"]
            if spec["log"]:
                out[name] = tune.loguniform(lo, hi)
            else:
                out[name] = tune.quniform(lo, hi, step) if step else tune.uniform(lo, hi)
        else:  # ray's randint excludes the upper bound; Optuna's includes it
            lo, hi = spec["low"], spec["high"]
            if spec["log"]:
                out[name] = tune.lograndint(lo, hi + 1)
            else:
                out[name] = tune.qrandint(lo, hi, step) if step and step > 1 else tune.randint(lo, hi + 1)
    return out


class DuplicateParameterError(ValueError):
    """A hyper-parameter name was sampled twice in one trial."""


class StrictTrial:
    """Wrap an Optuna trial so that sampling the same name twice raises instead of tying two parameters.

    Optuna allows ``trial.suggest_float("lr", ...)`` to be called several times in a trial (a loop may
    ask again) and returns the *first* value each time: if ``"lr"`` was meant for the learning rate and,
    by a copy-paste slip, for the weight decay too, both get the same value in every trial, and nothing
    fails. ``StrictTrial(trial)`` forwards everything to ``trial`` and raises on the second call.
    """

    def __init__(self, trial) -> None:
        self._trial = trial
        self._names: set[str] = set()

    def _record(self, name: str) -> None:
        if name in self._names:
            raise DuplicateParameterError(
                f"hyper-parameter {name!r} is sampled twice in this trial: Optuna would return the first value again, "
                f"tying two parameters together; give each hyper-parameter its own name")
        self._names.add(name)

    def suggest_float(self, name, *args, **kwargs):
        self._record(name)
        return self._trial.suggest_float(name, *args, **kwargs)

    def suggest_int(self, name, *args, **kwargs):
        self._record(name)
        return self._trial.suggest_int(name, *args, **kwargs)

    def suggest_categorical(self, name, *args, **kwargs):
        self._record(name)
        return self._trial.suggest_categorical(name, *args, **kwargs)

    def __getattr__(self, attr):
        return getattr(self._trial, attr)


# --------------------------------------------------------------------------------------------------
# Journal storage: one study, several processes, a shared file system
# --------------------------------------------------------------------------------------------------


class JournalPathError(ValueError):
    """The journal file cannot be used; the message says why and what to do."""


def journal_storage(path: str | os.PathLike):
    """An Optuna ``JournalStorage`` on the file ``path`` (created if needed; its folder must exist).

    Every process that opens the same file works on the same studies. The file is an append-only log of
    operations; a writer takes a lock made by an atomic ``symlink`` (``JournalFileSymlinkLock``), which
    NFS and Lustre support, unlike the ``fcntl`` locks SQLite relies on. Raises :class:`JournalPathError`
    (one line) when the path is a folder or cannot be written.
    """
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend, JournalFileSymlinkLock

    if not isinstance(path, (str, os.PathLike)) or not str(path).strip():
        raise JournalPathError(f"journal path must be a file path (str or Path), got {path!r}")
    path = Path(path).expanduser()
    hint = "give a file in a folder you can write to (on a cluster: a shared file system such as $WORK or $SCRATCH)"
    if path.is_dir():
        raise JournalPathError(f"journal path {path} is a folder: {hint}, e.g. {path / 'journal.log'}")
    if not path.parent.is_dir():
        raise JournalPathError(f"journal file {path} is not writable (its folder {path.parent} does not exist): {hint}")
    try:
        with open(path, "ab"):
            pass
        probe_writable(path.parent, create=False)  # the lock is a file created next to the journal
    except OSError as exc:
        raise JournalPathError(f"journal file {path} is not writable ({exc.strerror or exc}): {hint}") from None
    backend = JournalFileBackend(str(path), lock_obj=JournalFileSymlinkLock(str(path)))
    return JournalStorage(backend)


def run_worker(journal: str | os.PathLike, study_name: str, function: str, n_trials: int, *, seed: int,
               worker: int = 0, sleep_s: float = 0.0) -> dict[str, Any]:
    """Optimise a toy function on an existing study of the journal: ``n_trials`` trials, then a summary.

    Each worker needs its *own* sampler seed: with the same seed, two workers would propose the same
    points. ``sleep_s`` stands for the cost of a real training step, so that trials overlap in time.
    """
    import optuna

    fn = toy_function(function)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = journal_storage(journal)
    try:
        study = optuna.load_study(study_name=study_name, storage=storage,
                                  sampler=optuna.samplers.TPESampler(seed=seed))
    except KeyError:
        raise ValueError(f"no study {study_name!r} in {journal}: create it first (optuna.create_study(storage=..., "
                         f"study_name={study_name!r}))") from None

    def objective(trial):
        trial.set_user_attr("worker", worker)
        value = fn.objective(trial)
        if sleep_s:
            time.sleep(sleep_s)
        return value

    start = time.perf_counter()
    study.optimize(objective, n_trials=n_trials)
    mine = [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("worker") == worker]
    return {"worker": worker, "pid": os.getpid(), "seed": seed, "trials": len(mine),
            "best_own": min(t.value for t in mine if t.value is not None),
            "trials_in_study_at_end": len(study.trials), "seconds": time.perf_counter() - start}


def launch_workers(journal: str | os.PathLike, study_name: str, *, n_workers: int = 2, n_trials: int = 10,
                   function: str = "himmelblau", seed: int = 0, sleep_s: float = 0.0,
                   timeout_s: float = 300) -> list[dict[str, Any]]:
    """Start ``n_workers`` processes (``python -m dlo.hpo worker``) on one study and wait for them.

    Worker ``i`` uses sampler seed ``seed + i``. Returns each worker's summary; a failing worker raises
    a RuntimeError with its last error line.
    """
    if not isinstance(n_workers, int) or isinstance(n_workers, bool) or n_workers < 1:
        raise ValueError(f"n_workers must be a positive integer, got {n_workers!r}")
    journal_storage(journal)  # fail here, in one line, rather than in every worker
    toy_function(function)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    procs = []
    for i in range(n_workers):
        cmd = [sys.executable, "-m", "dlo.hpo", "worker", "--journal", str(journal), "--study", study_name,
               "--function", function, "--n-trials", str(n_trials), "--seed", str(seed + i), "--worker", str(i),
               "--sleep", str(sleep_s)]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    summaries = []
    for i, proc in enumerate(procs):
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise RuntimeError(f"worker {i} did not finish within {timeout_s} s") from None
        if proc.returncode != 0:
            last = [ln for ln in err.strip().splitlines() if ln.strip()]
            raise RuntimeError(f"worker {i} failed (exit {proc.returncode}): {last[-1] if last else 'no message'}")
        summaries.append(json.loads(out.strip().splitlines()[-1]))
    return summaries


# --------------------------------------------------------------------------------------------------
# A small CIFAR-10 training, one epoch per call
# --------------------------------------------------------------------------------------------------


def load_cifar_tensors(n_train: int, n_val: int, data_dir: str | os.PathLike | None = None,
                       verbose: bool = True) -> dict[str, torch.Tensor]:
    """The first ``n_train`` training and ``n_val`` test images of CIFAR-10 (or of the generated stand-in,
    see :func:`dlo.data.cifar10`) as normalised tensors in memory: ``x_train, y_train, x_val, y_val``.

    Held in memory, the data costs nothing per trial: a search runs many short trainings, and a loader
    started for each one would dominate their time.
    """
    from . import data

    for name, n in (("n_train", n_train), ("n_val", n_val)):
        if not isinstance(n, int) or isinstance(n, bool) or n < 10:
            raise ValueError(f"{name} must be an integer >= 10, got {n!r}")
    sizes = dict(n_train=max(n_train, 10000), n_test=max(n_val, 2000))  # generated data: the set other lessons use
    train = data.cifar10("train", data_dir, data.test_transform(), verbose=verbose, **sizes)
    test = data.cifar10("test", data_dir, data.test_transform(), verbose=False, **sizes)
    (x_train, y_train), = data.preload_batches(train, 1, batch_size=n_train)
    (x_val, y_val), = data.preload_batches(test, 1, batch_size=n_val)
    return {"x_train": x_train, "y_train": y_train, "x_val": x_val, "y_val": y_val}


class TinyMLP(nn.Sequential):
    """Average-pool the 32x32 image to 8x8, then one hidden layer: a model that trains in milliseconds."""

    def __init__(self, hidden: int = 64, num_classes: int = 10) -> None:
        super().__init__(nn.AvgPool2d(4), nn.Flatten(), nn.Linear(3 * 8 * 8, hidden), nn.ReLU(),
                         nn.Linear(hidden, num_classes))


HPARAMS = {"lr": None, "momentum": 0.9, "weight_decay": 0.0}  # None: required


class Trainer:
    """One trial's training: model, SGD optimiser and data; :meth:`train_epoch` runs one epoch and returns
    the validation accuracy.

    ``config`` holds the hyper-parameters ``lr`` (required), ``momentum`` (0.9) and ``weight_decay`` (0);
    any other name is an error, so a typo in a search space cannot go unnoticed. ``arch`` is ``"resnet"``
    (:func:`dlo.models.resnet18_cifar` of the given ``width``) or ``"mlp"`` (:class:`TinyMLP` with ``width``
    hidden units). :meth:`state_dict` / :meth:`load_state_dict` save and restore everything needed to
    continue (for checkpoints), and :meth:`set_hparams` changes the hyper-parameters in place (what
    Population Based Training does after copying a better trial).
    """

    def __init__(self, config: Mapping[str, Any], data: Mapping[str, torch.Tensor], *, arch: str = "resnet",
                 width: int = 4, batch_size: int = 64, device: str | torch.device = "cpu", seed: int = 0) -> None:
        missing = {"x_train", "y_train", "x_val", "y_val"} - set(data)
        if missing:
            raise ValueError(f"data lacks {', '.join(sorted(missing))}: build it with dlo.hpo.load_cifar_tensors")
        if arch not in ("resnet", "mlp"):
            raise ValueError(f"unknown arch {arch!r}: use 'resnet' or 'mlp'")
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        self.config = self._check_config(config)
        self.device = torch.device(device)
        self.batch_size = batch_size
        self.seed = seed
        self.epoch = 0
        torch.manual_seed(seed)
        if arch == "resnet":
            from .models import resnet18_cifar  # imports torchvision: only when needed (Ray workers start faster)

            model = resnet18_cifar(width=width)
        else:
            model = TinyMLP(hidden=width)
        self.model = model.to(self.device)
        self.data = {k: v.to(self.device) for k, v in data.items()}
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=self.config["lr"],
                                         momentum=self.config["momentum"], weight_decay=self.config["weight_decay"])

    @staticmethod
    def _check_config(config: Mapping[str, Any]) -> dict[str, float]:
        if not isinstance(config, Mapping):
            raise ValueError(f"config must be a dict of hyper-parameters, got {type(config).__name__}")
        unknown = sorted(set(config) - set(HPARAMS))
        if unknown:
            raise ValueError(f"unknown hyper-parameter(s) {', '.join(map(repr, unknown))}: the Trainer uses "
                             f"{', '.join(HPARAMS)}")
        if "lr" not in config:
            raise ValueError("config needs 'lr', the learning rate")
        out = {k: float(config.get(k, default)) for k, default in HPARAMS.items()}
        if not (out["lr"] > 0 and out["weight_decay"] >= 0 and 0 <= out["momentum"] < 1):
            raise ValueError(f"need lr > 0, weight_decay >= 0 and 0 <= momentum < 1, got {out}")
        return out

    def set_hparams(self, config: Mapping[str, Any]) -> None:
        """New hyper-parameters for the next epochs, keeping the weights and the optimiser's momentum."""
        self.config = self._check_config({**self.config, **config})
        for group in self.optimizer.param_groups:
            group.update(lr=self.config["lr"], momentum=self.config["momentum"],
                         weight_decay=self.config["weight_decay"])

    def train_epoch(self) -> float:
        """One epoch over the training tensors (shuffled, seeded by ``seed`` and the epoch), then the accuracy."""
        x, y = self.data["x_train"], self.data["y_train"]
        gen = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        order = torch.randperm(len(y), generator=gen).to(self.device)
        self.model.train()
        for i in range(0, len(y), self.batch_size):
            idx = order[i:i + self.batch_size]
            loss = F.cross_entropy(self.model(x[idx]), y[idx])
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
        self.epoch += 1
        return self.evaluate()

    @torch.inference_mode()
    def evaluate(self) -> float:
        """Accuracy on the validation tensors (eval mode; a diverged model scores what its argmax gives)."""
        self.model.eval()
        x, y = self.data["x_val"], self.data["y_val"]
        correct = sum((self.model(x[i:i + 512]).argmax(1) == y[i:i + 512]).sum().item() for i in range(0, len(y), 512))
        return correct / len(y)

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), "epoch": self.epoch,
                "config": dict(self.config)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.epoch = int(state["epoch"])
        self.config = self._check_config(state["config"])


# --------------------------------------------------------------------------------------------------
# Ray
# --------------------------------------------------------------------------------------------------

_SOCKET_MAX = 107  # bytes in an AF_UNIX socket path on Linux
_SESSION_TAIL = len("/session_2026-01-01_00-00-00_000000_4194304/sockets/plasma_store")


def ray_temp_dir(preferred: str | os.PathLike | None = None) -> Path:
    """Where Ray keeps its session (logs, sockets): ``preferred`` or ``.cache/ray``, unless that path is too
    long for the Unix sockets Ray creates inside it (107 bytes on Linux); then a short folder in ``/tmp``."""
    base = Path(preferred) if preferred is not None else CACHE_DIR / "ray"
    if len(str(base.resolve()).encode()) + _SESSION_TAIL <= _SOCKET_MAX:
        return base.resolve()
    uid = os.getuid() if hasattr(os, "getuid") else "user"
    return Path(tempfile.gettempdir()) / f"dlo-ray-{uid}"


def _stop_ray_children() -> None:
    """Stop the Ray processes this process started (a half-started Ray, after a failed ``ray.init``)."""
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil comes with ipykernel
        return
    def is_ray(proc) -> bool:
        try:
            command = " ".join(proc.cmdline())
        except psutil.Error:
            return False
        return any(key in command for key in ("gcs_server", "raylet", "/ray/", "ray::"))

    ours = [p for p in psutil.Process().children(recursive=True) if is_ray(p)]
    for p in ours:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(ours, timeout=5)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()


_RAY_START_ATTEMPTS = 3  # Ray gives its node a fixed 30 s to register; a busy machine may need another go


def ray_start(num_cpus: int, num_gpus: int | None = None, temp_dir: str | os.PathLike | None = None,
              log_to_driver: bool = False) -> dict[str, Any]:
    """Start a local Ray for a notebook, or join the cluster named by ``$RAY_ADDRESS``; say what was started.

    ``num_cpus`` is the number of trials Ray may run at once with one CPU each (not the machine's core
    count, which on a shared node is not all yours). No dashboard, no usage statistics
    (``RAY_USAGE_STATS_ENABLED=0``: a compute node has no network), no idle workers started in advance
    (Tune's trials start their own, and on two cores those would only compete), Tune's compact output, and Ray's token
    authentication kept on (other users of a shared node cannot submit work to your Ray), with its token
    file in the temp folder rather than ``~/.ray``. ``log_to_driver=False`` keeps the trials' prints out
    of the notebook. When ``$RAY_ADDRESS`` is set (``slurm/ray_tune.sbatch`` exports it), Ray is already
    running on the allocation's nodes: this joins it, and the cluster's own CPUs and GPUs count.
    Returns ``{"address", "temp_dir", "num_cpus", "num_gpus", "seconds"}``.
    """
    import logging

    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    os.environ.setdefault("RAY_prestart_worker_first_driver", "0")  # Tune's trials start their own workers anyway
    start = time.perf_counter()
    if os.environ.get("RAY_ADDRESS"):
        ctx = ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=log_to_driver, ignore_reinit_error=True,
                       logging_level=logging.WARNING)
        tmp = None
    else:
        if not isinstance(num_cpus, int) or isinstance(num_cpus, bool) or num_cpus < 1:
            raise ValueError(f"num_cpus must be a positive integer, got {num_cpus!r}")
        tmp = ray_temp_dir(temp_dir)
        tmp.mkdir(parents=True, exist_ok=True)
        if not ({"RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"} & set(os.environ)):
            token = tmp / "auth_token"  # Ray would otherwise write one to ~/.ray/auth_token
            if not token.is_file():
                token.write_text(uuid.uuid4().hex)
                token.chmod(0o600)
            os.environ["RAY_AUTH_TOKEN_PATH"] = str(token)
        auth_log = logging.getLogger("ray._private.authentication.authentication_token_setup")
        level = auth_log.level
        auth_log.setLevel(logging.ERROR)  # "token authentication is enabled": it is, on purpose
        try:
            for attempt in range(1, _RAY_START_ATTEMPTS + 1):
                try:
                    ctx = ray.init(num_cpus=num_cpus, num_gpus=num_gpus, include_dashboard=False,
                                   log_to_driver=log_to_driver, ignore_reinit_error=True, _temp_dir=str(tmp),
                                   logging_level=logging.WARNING)
                    break
                except Exception as exc:  # noqa: BLE001 - Ray raises a bare Exception for this
                    if "timed out during startup" not in str(exc):
                        raise
                    _stop_ray_children()
                    load = f"load average {os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else "a busy machine"
                    if attempt == _RAY_START_ATTEMPTS:
                        raise RuntimeError(f"Ray did not start in {attempt} tries: its node must register within 30 s, and this "
                                           f"machine is too busy ({load} for {os.cpu_count()} cores); try again "
                                           f"when it is quieter") from None
                    print(f"Ray did not start within its 30 s limit ({load} for {os.cpu_count()} cores): "
                          f"trying once more", file=sys.stderr, flush=True)
        finally:
            auth_log.setLevel(level)
    resources = ray.cluster_resources()
    return {"address": ctx.address_info.get("address"), "temp_dir": str(tmp) if tmp else None,
            "num_cpus": int(resources.get("CPU", 0)), "num_gpus": float(resources.get("GPU", 0)),
            "seconds": time.perf_counter() - start}


def tune_progress(total: int, desc: str, metrics: Sequence[str] = ("accuracy", "epoch", "lr")):
    """A Ray Tune callback, in the notebook's process, that records every reported result (``.records``: trial
    id, ``training_iteration`` and ``metrics``) and advances a tqdm bar each time a trial ends.

    Recording in the driver keeps the whole history of each trial, including what PBT does to it (Tune's
    own per-trial files start again when PBT restarts a trial from another one's checkpoint).
    """
    from ray.tune import Callback
    from tqdm.auto import tqdm

    class TuneProgress(Callback):
        def __init__(self) -> None:
            self.bar = None
            self.records: list[dict[str, Any]] = []

        def setup(self, **info) -> None:
            self.bar = tqdm(total=total, desc=desc)

        def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
            row = {"trial": trial.trial_id, "iteration": result.get("training_iteration")}
            row.update({k: result[k] for k in metrics if k in result})
            self.records.append(row)

        def _tick(self) -> None:
            if self.bar is not None:
                self.bar.update()

        def on_trial_complete(self, iteration, trials, trial, **info) -> None:
            self._tick()

        def on_trial_error(self, iteration, trials, trial, **info) -> None:
            self._tick()

        def on_experiment_end(self, trials, **info) -> None:
            if self.bar is not None:
                self.bar.close()

        def __getstate__(self) -> dict:  # Tune saves its callbacks with the experiment state: not the bar
            return {"records": self.records}

        def __setstate__(self, state: dict) -> None:
            self.bar, self.records = None, state.get("records", [])

    return TuneProgress()


def pbt_exploits(experiment_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """What Population Based Training did, from its ``pbt_global.txt`` log: one row per exploit (a trial
    restarted from a better trial's checkpoint) with the explored (perturbed) hyper-parameters."""
    path = Path(experiment_dir) / "pbt_global.txt"
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        if line.strip():
            target, source, target_iter, source_iter, old, new = json.loads(line)
            rows.append({"trial": target.split("_", 1)[0], "copied from": source.split("_", 1)[0],
                         "at iteration": target_iter, "from iteration": source_iter,
                         **{f"{k} before": v for k, v in old.items()}, **{f"{k} after": v for k, v in new.items()}})
    return rows


# --------------------------------------------------------------------------------------------------
# Comparison tables
# --------------------------------------------------------------------------------------------------


def study_summary(study, wall_s: float, name: str | None = None) -> dict[str, Any]:
    """One row: trials finished / pruned, best value, epochs trained (reported steps), wall time."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    epochs = sum(max(t.intermediate_values) if t.intermediate_values else 0 for t in trials)
    return {"method": name or study.study_name, "trials": len(trials), "complete": len(complete),
            "pruned": len(pruned), "best value": study.best_value if complete else math.nan,
            "epochs trained": epochs, "wall time (s)": wall_s}


def ray_summary(records: Sequence[Mapping[str, Any]], results, wall_s: float, name: str, max_epochs: int,
                metric: str = "accuracy", mode: str = "max") -> dict[str, Any]:
    """The same row for a Ray Tune run, from the results recorded by :func:`tune_progress` (one per epoch).

    A trial stopped early is one whose last epoch is below ``max_epochs``; the best value is the best final
    ``metric`` of the trials that trained all epochs, as for an Optuna study.
    """
    if mode not in ("min", "max"):
        raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
    last: dict[str, Mapping[str, Any]] = {}
    for r in records:
        if r["trial"] not in last or r.get("epoch", 0) >= last[r["trial"]].get("epoch", 0):
            last[r["trial"]] = r
    finals = [r[metric] for r in last.values() if r.get("epoch", 0) >= max_epochs and metric in r]
    best = (max if mode == "max" else min)(finals) if finals else math.nan
    return {"method": name, "trials": len(results), "complete": len(finals), "pruned": len(last) - len(finals),
            "best value": best, "epochs trained": len(records), "wall time (s)": wall_s,
            "errors": results.num_errors}


# --------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dlo.hpo", description="Optuna workers sharing a journal study.")
    sub = p.add_subparsers(dest="command", required=True)
    w = sub.add_parser("worker", help="optimise a toy function on an existing study of a journal file")
    w.add_argument("--journal", required=True, help="journal file shared by the workers")
    w.add_argument("--study", required=True, help="study name (create it first)")
    w.add_argument("--function", default="himmelblau", help=f"one of: {', '.join(TOY_FUNCTIONS)}")
    w.add_argument("--n-trials", type=int, default=10)
    w.add_argument("--seed", type=int, default=0, help="sampler seed: give each worker its own")
    w.add_argument("--worker", type=int, default=0, help="worker number, stored with each of its trials")
    w.add_argument("--sleep", type=float, default=0.0, help="seconds of pretend work per trial")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.n_trials < 1:
            raise ValueError(f"--n-trials must be >= 1, got {args.n_trials}")
        summary = run_worker(args.journal, args.study, args.function, args.n_trials, seed=args.seed,
                             worker=args.worker, sleep_s=args.sleep)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
