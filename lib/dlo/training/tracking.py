"""Experiment tracking for :func:`dlo.training.loop.train`: TensorBoard and a local MLflow file store.

A run that nobody can find again is a run wasted. With ``TrainConfig(tracking_dir=...)`` every call of
``train()`` records, under that folder:

- ``tensorboard/<run name>/``: TensorBoard event files (``torch.utils.tensorboard.SummaryWriter``): the
  training loss and learning rate per log step, the validation accuracy / loss and the seconds per epoch,
  and, at the end, the hyper-parameters with the final metrics (``add_hparams``: TensorBoard's HPARAMS tab
  compares runs side by side). View with ``tensorboard --logdir <tracking_dir>/tensorboard``.
- ``mlruns/``: an MLflow *file store* (no server: tracking URI ``file://<tracking_dir>/mlruns``) with the
  same parameters and metrics. :func:`runs_table` reads it back as a pandas DataFrame, one row per run;
  :func:`metric_history` gives one metric's curve. ``mlflow ui --backend-store-uri file://...`` shows it.
- where MLflow is not installed (a GPU node may have torch, pandas and TensorBoard only), ``jsonruns/`` instead:
  one JSON-lines file per run with the same parameters and metrics, which :func:`runs_table` and
  :func:`metric_history` read back the same way. Tracking never stops a run for want of MLflow: the first run
  says so in one line (:func:`describe`).

Only the main process (rank 0) of a distributed run tracks. The folder must be writable: it is checked
before training starts (one-line error otherwise). Keep it under ``runs/`` (ignored by git).
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import re
import time
import uuid
import warnings
from pathlib import Path
from typing import Any, Iterable

from dlo.runtime.paths import probe_writable

EXPERIMENT = "dlo"
#: MLflow as requirements.txt pins it (the install hint where it is missing)
MLFLOW_PIN = "mlflow-skinny==3.17.2"
#: The folder, under a tracking folder, of the runs tracked without MLflow (one ``<run id>.jsonl`` each)
JSON_STORE = "jsonruns"


def mlflow_missing() -> str | None:
    """One line saying that MLflow is not installed (and how to install it); None when it is."""
    if importlib.util.find_spec("mlflow") is not None:
        return None
    return f"MLflow is not installed in this Python (a GPU node may not have it: pip install {MLFLOW_PIN})"


def describe(tracking_dir: str | os.PathLike) -> str:
    """One line: where the runs tracked under ``tracking_dir`` go in this Python."""
    path = Path(tracking_dir).expanduser().resolve()
    missing = mlflow_missing()
    if missing is None:
        return f"tracking: TensorBoard and an MLflow file store under {path}"
    return f"tracking: {missing}; the runs go to TensorBoard and to JSON records in {path / JSON_STORE} instead"


_announced: set[Path] = set()


def announce(tracking_dir: str | os.PathLike) -> None:
    """Print :func:`describe`'s line, once per folder and process."""
    path = Path(tracking_dir).expanduser().resolve()
    if path not in _announced:
        _announced.add(path)
        print(describe(path), flush=True)


def check_writable(tracking_dir: str | os.PathLike) -> Path:
    """Create ``tracking_dir`` if needed and check a file can be written there; one-line ValueError if not."""
    if tracking_dir is None or str(tracking_dir) == "":
        raise ValueError("tracking_dir is empty: give a folder (e.g. runs/<name>/tracking) or None to turn tracking off")
    path = Path(tracking_dir).expanduser().resolve()
    try:
        probe_writable(path)
    except OSError as exc:
        raise ValueError(f"tracking_dir {path} is not writable ({exc.strerror or exc}): pass a folder you can write "
                         f"to (e.g. runs/<name>/tracking) or tracking_dir=None to turn tracking off") from None
    return path


def mlflow_uri(tracking_dir: str | os.PathLike) -> str:
    """The MLflow tracking URI of the local file store under ``tracking_dir``."""
    return (Path(tracking_dir).expanduser().resolve() / "mlruns").as_uri()


@contextlib.contextmanager
def _file_store_allowed():
    """MLflow 3.x keeps the file store "in maintenance mode" and refuses it unless MLFLOW_ALLOW_FILE_STORE=true.
    We opt in around our own calls only (a folder of plain files needs no server and no database, and is what a
    compute node without network can keep next to its results); MLflow builds (and caches) the store lazily,
    so every call that may build it runs inside this context."""
    import warnings

    old = os.environ.get("MLFLOW_ALLOW_FILE_STORE")
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        if old is None:
            os.environ.pop("MLFLOW_ALLOW_FILE_STORE", None)
        else:
            os.environ["MLFLOW_ALLOW_FILE_STORE"] = old


def _client(tracking_dir: str | os.PathLike):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=mlflow_uri(tracking_dir))


def _param_value(value: Any) -> str | int | float | bool:
    """A value TensorBoard's hparams accept (int, float, str, bool); None and sequences become strings."""
    if isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def flatten_params(params: dict[str, Any]) -> dict[str, str | int | float | bool]:
    return {str(k): _param_value(v) for k, v in params.items()}


class _MlflowRun:
    """One run in the MLflow file store under a tracking folder."""

    kind = "mlflow"

    def __init__(self, folder: Path, name: str, params: dict[str, Any], experiment: str) -> None:
        from mlflow.entities import Param

        with _file_store_allowed():
            client = _client(folder)
            exp = client.get_experiment_by_name(experiment)
            exp_id = exp.experiment_id if exp is not None else client.create_experiment(experiment)
            run = client.create_run(exp_id, run_name=name)
            self.client, self.run_id = client, run.info.run_id
            items = list(params.items())
            for i in range(0, len(items), 100):  # MLflow takes at most 100 params per batch
                client.log_batch(self.run_id, params=[Param(k, str(v)[:6000]) for k, v in items[i:i + 100]])

    def log(self, metrics: dict[str, float], step: int, when_ms: int) -> None:
        from mlflow.entities import Metric

        with _file_store_allowed():
            self.client.log_batch(self.run_id, metrics=[Metric(k, v, when_ms, int(step)) for k, v in metrics.items()])

    def terminate(self, status: str) -> None:
        with _file_store_allowed():
            self.client.set_terminated(self.run_id, status)


class _JsonRun:
    """One run as a JSON-lines file, ``<folder>/jsonruns/<run id>.jsonl``, where MLflow is not installed: a first
    line with the run's name, experiment, start time and parameters (as strings, as MLflow keeps them), one line
    per :meth:`log` call, a last line with the status. Appended as it goes: a killed run keeps what it logged."""

    kind = "json"

    def __init__(self, folder: Path, name: str, params: dict[str, Any], experiment: str) -> None:
        self.run_id = uuid.uuid4().hex
        self.path = folder / JSON_STORE / f"{self.run_id}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._append({"run_id": self.run_id, "run_name": name, "experiment": experiment, "start_ns": time.time_ns(),
                      "params": {k: str(v)[:6000] for k, v in params.items()}})

    def _append(self, entry: dict[str, Any]) -> None:
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(entry) + "\n")

    def log(self, metrics: dict[str, float], step: int, when_ms: int) -> None:
        self._append({"step": int(step), "time_ms": when_ms, "metrics": metrics})

    def terminate(self, status: str) -> None:
        self._append({"status": status})


class Tracker:
    """Writes one run to TensorBoard and MLflow (or, where MLflow is not installed, to TensorBoard and a JSON-lines
    file: :class:`_JsonRun`). Use as a context manager, or call :meth:`close`.

    ``params``: the hyper-parameters (e.g. ``dataclasses.asdict(TrainConfig)`` plus what the caller adds).
    :meth:`log` takes a dict of metrics at a step; :meth:`close` writes the hparams summary with the final
    metrics and marks the run FINISHED (or KILLED when ``status="KILLED"``, e.g. stopped by a signal).
    """

    def __init__(self, tracking_dir: str | os.PathLike, params: dict[str, Any], run_name: str | None = None,
                 experiment: str = EXPERIMENT) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.dir = check_writable(tracking_dir)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        name = run_name or f"run-{stamp}"
        if not re.fullmatch(r"[\w.\-+=]+", name):
            raise ValueError(f"run_name {name!r}: use letters, digits and . - _ + = only (it names a folder)")
        self.run_name = name
        self.params = flatten_params(params)
        self.final: dict[str, float] = {}
        self._start = time.perf_counter()
        tb_dir = self.dir / "tensorboard" / f"{name}-{uuid.uuid4().hex[:6]}"
        self.writer = SummaryWriter(log_dir=str(tb_dir))
        self.tensorboard_dir = tb_dir
        if mlflow_missing() is None:
            self.store: _MlflowRun | _JsonRun = _MlflowRun(self.dir, name, self.params, experiment)
        else:
            announce(self.dir)
            self.store = _JsonRun(self.dir, name, self.params, experiment)
        self.backend, self.run_id = self.store.kind, self.store.run_id
        self.closed = False

    def log(self, metrics: dict[str, float], step: int) -> None:
        """Log scalar ``metrics`` at ``step`` (names like ``train/loss``; ``/`` is kept in every store)."""
        now = int(time.time() * 1000)
        finite = {}
        for key, value in metrics.items():
            value = float(value)
            self.writer.add_scalar(key, value, step)
            if math.isfinite(value):
                finite[key] = value
            self.final[key] = value
        if finite:
            self.store.log(finite, step, now)

    def close(self, status: str = "FINISHED", extra_final: dict[str, float] | None = None) -> None:
        if self.closed:
            return
        self.closed = True
        final = dict(self.final)
        final["time/total_s"] = time.perf_counter() - self._start
        final.update(extra_final or {})
        self.log({"time/total_s": final["time/total_s"], **(extra_final or {})}, step=0)
        metric_dict = {f"hparam/{k}": v for k, v in final.items() if math.isfinite(v)}
        self.writer.add_hparams(self.params, metric_dict, run_name=".")
        self.writer.close()
        self.store.terminate(status)

    def __enter__(self) -> "Tracker":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close("FAILED" if exc_type is not None else "FINISHED")


def store_of(tracking_dir: str | os.PathLike) -> str:
    """Which store :func:`runs_table` reads under ``tracking_dir`` in this Python: ``"mlflow"`` (its MLflow store,
    MLflow installed) or ``"json"`` (the runs tracked without MLflow). Neither there: one-line FileNotFoundError."""
    path = Path(tracking_dir).expanduser()
    mlflow_store = (path / "mlruns").is_dir()
    if mlflow_store and mlflow_missing() is None:
        return "mlflow"
    if (path / JSON_STORE).is_dir():
        return "json"
    if mlflow_store:
        raise FileNotFoundError(f"the runs under {path} were tracked with MLflow, and {mlflow_missing()}")
    raise FileNotFoundError(f"no tracking store at {path} (neither mlruns/ nor {JSON_STORE}/): train with "
                            f"TrainConfig(tracking_dir={str(path)!r}) first")


def viewing_line(tracking_dir: str | os.PathLike) -> str:
    """One line: what :func:`runs_table` reads under ``tracking_dir`` here, and how to browse the same runs."""
    path = Path(tracking_dir).expanduser().resolve()
    uri, board = mlflow_uri(path), f"`tensorboard --logdir {path / 'tensorboard'}`"
    if store_of(path) == "mlflow":
        return (f"Read from the MLflow store {uri}: `mlflow ui --backend-store-uri {uri}` shows the same runs in a "
                f"browser (parameters side by side, each metric's curve); {board} shows the curves too.")
    return (f"{mlflow_missing()}: read from the JSON records in {path / JSON_STORE}, which hold the same parameters and "
            f"metrics. With MLflow installed, the runs also go to an MLflow store, and `mlflow ui --backend-store-uri "
            f"{uri}` shows them in a browser (parameters side by side, each metric's curve); {board} shows the curves "
            f"now.")


def _runs(tracking_dir: str | os.PathLike, experiment: str):
    path = Path(tracking_dir).expanduser()
    with _file_store_allowed():
        client = _client(path)
        exp = client.get_experiment_by_name(experiment)
        if exp is None:
            return client, []
        runs, token = [], None
        while True:
            page = client.search_runs([exp.experiment_id], max_results=1000, page_token=token,
                                      order_by=["attributes.start_time ASC"])
            runs.extend(page)
            token = page.token
            if not token:
                return client, runs


class BadRecord(UserWarning):
    """A record of the JSON-lines store that is left out (its file and field named); every other record is read."""


def _bad(path: Path, what: str) -> None:
    warnings.warn(f"{path}: {what}: left out, the other records are read", BadRecord, stacklevel=3)


def _json_lines(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """(line number, entry) of one :class:`_JsonRun` file. A run killed while appending leaves a cut last line: it is
    left out silently (what was logged before it is kept); any other line that is not a JSON object is left out
    with one :class:`BadRecord` warning naming the file and the line."""
    texts = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    entries = []
    for number, text in enumerate(texts, 1):
        try:
            entry = json.loads(text)
        except json.JSONDecodeError:
            if number != len(texts):
                _bad(path, f"line {number} is not a JSON record ({text[:60]!r})")
            continue
        if isinstance(entry, dict):
            entries.append((number, entry))
        else:
            _bad(path, f"line {number} is a JSON {type(entry).__name__}, not a record")
    return entries


#: The first line of a run file: field -> the types it may have.
_HEAD = {"run_id": str, "run_name": str, "experiment": str, "start_ns": int, "params": dict}


def _field_problem(entry: dict[str, Any], fields: dict[str, type | tuple[type, ...]]) -> str | None:
    for name, kind in fields.items():
        value = entry.get(name)
        if not isinstance(value, kind) or isinstance(value, bool):
            return f"field {name} is {value!r}" if name in entry else f"no field {name}"
    return None


def _history_entry(path: Path, number: int, entry: dict[str, Any], history: dict[str, list]) -> None:
    """Adds one logged line's metrics to ``history``; a line of the wrong shape is one warning, left out."""
    problem = _field_problem(entry, {"step": int, "time_ms": int, "metrics": dict})
    if problem:
        _bad(path, f"line {number}: {problem}")
        return
    for key, value in entry["metrics"].items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            _bad(path, f"line {number}: metric {key} is {value!r}, not a number")
            continue
        history.setdefault(key, []).append((entry["step"], entry["time_ms"], float(value)))


def _json_runs(tracking_dir: str | os.PathLike, experiment: str) -> list[dict[str, Any]]:
    """The runs of :class:`_JsonRun` files, oldest first: ``run_id``, ``run_name``, ``status`` (RUNNING until closed),
    ``params`` and ``history`` (metric -> [(step, time_ms, value)], in logging order). A record of the wrong shape
    is left out with one warning naming the file and field; a run whose first line is unusable is left out whole."""
    runs = []
    for path in sorted((Path(tracking_dir).expanduser() / JSON_STORE).glob("*.jsonl")):
        lines = _json_lines(path)
        if not lines:
            continue
        (number, head), rest = lines[0], lines[1:]
        problem = _field_problem(head, _HEAD)
        if problem:
            _bad(path, f"line {number} (the run's first line): {problem}; the whole run")
            continue
        if head["experiment"] != experiment:
            continue
        history: dict[str, list] = {}
        status = "RUNNING"
        for number, entry in rest:
            if "status" in entry:
                if isinstance(entry["status"], str):
                    status = entry["status"]
                else:
                    _bad(path, f"line {number}: field status is {entry['status']!r}")
            else:
                _history_entry(path, number, entry, history)
        runs.append({"run_id": head["run_id"], "run_name": head["run_name"], "start_ns": head["start_ns"],
                     "status": status, "params": head["params"], "history": history})
    return sorted(runs, key=lambda r: (r["start_ns"], r["run_id"]))


def _latest(points: list[tuple[int, int, float]]) -> float:
    """A metric's value as MLflow reports it for a run: the one at the largest step (then the latest time)."""
    return max(points, key=lambda p: (p[0], p[1], p[2]))[2]


def _run_rows(tracking_dir: str | os.PathLike, experiment: str) -> list[dict[str, Any]]:
    """Each run, oldest first, in one form whatever the store: run_id, run_name, status, params, metrics (final)."""
    if store_of(tracking_dir) == "json":
        return [{**r, "metrics": {k: _latest(v) for k, v in r["history"].items()}}
                for r in _json_runs(tracking_dir, experiment)]
    _, runs = _runs(tracking_dir, experiment)
    return [{"run_id": r.info.run_id, "run_name": r.info.run_name, "status": r.info.status, "params": r.data.params,
             "metrics": r.data.metrics} for r in runs]


def runs_table(tracking_dir: str | os.PathLike, params: Iterable[str] | None = None,
               experiment: str = EXPERIMENT):
    """A pandas DataFrame with one row per tracked run (oldest first): ``run_name``, ``status``,
    ``run_id``, the parameters (all, or only those named in ``params``) and the final value of every metric.
    Read from the MLflow store, or where MLflow is not installed from the JSON records (:func:`store_of`).

    Parameter values come back as strings (MLflow stores them so); numbers are converted back where they
    parse as numbers."""
    import pandas as pd

    rows = []
    wanted = None if params is None else list(params)
    for run in _run_rows(tracking_dir, experiment):
        row: dict[str, Any] = {"run_name": run["run_name"], "status": run["status"]}
        ps = run["params"]
        for k in (wanted if wanted is not None else sorted(ps)):
            row[k] = _parse(ps.get(k))
        row.update(sorted(run["metrics"].items()))
        row["run_id"] = run["run_id"]
        rows.append(row)
    return pd.DataFrame(rows)


def metric_history(tracking_dir: str | os.PathLike, key: str, experiment: str = EXPERIMENT):
    """A long DataFrame (``run_name``, ``step``, ``value``) of metric ``key`` for every tracked run."""
    import pandas as pd

    rows = []
    if store_of(tracking_dir) == "json":
        for run in _json_runs(tracking_dir, experiment):
            for step, _, value in sorted(run["history"].get(key, []), key=lambda p: (p[0], p[1])):
                rows.append({"run_name": run["run_name"], "run_id": run["run_id"], "step": step, "value": value})
    else:
        client, runs = _runs(tracking_dir, experiment)
        for run in runs:
            with _file_store_allowed():
                history = client.get_metric_history(run.info.run_id, key)
            for m in sorted(history, key=lambda m: (m.step, m.timestamp)):
                rows.append({"run_name": run.info.run_name, "run_id": run.info.run_id, "step": m.step,
                             "value": m.value})
    return pd.DataFrame(rows, columns=["run_name", "run_id", "step", "value"])


def _parse(text: str | None) -> Any:
    if text is None:
        return None
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text
