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

Only the main process (rank 0) of a distributed run tracks. The folder must be writable: it is checked
before training starts (one-line error otherwise). Keep it under ``runs/`` (ignored by git).
"""
from __future__ import annotations

import contextlib
import math
import os
import re
import time
import uuid
from pathlib import Path
from typing import Any, Iterable

from dlo.runtime.paths import probe_writable

EXPERIMENT = "dlo"


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


class Tracker:
    """Writes one run to TensorBoard and MLflow. Use as a context manager, or call :meth:`close`.

    ``params``: the hyper-parameters (e.g. ``dataclasses.asdict(TrainConfig)`` plus what the caller adds).
    :meth:`log` takes a dict of metrics at a step; :meth:`close` writes the hparams summary with the final
    metrics and marks the MLflow run FINISHED (or KILLED when ``status="KILLED"``, e.g. stopped by a signal).
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
        from mlflow.entities import Param

        with _file_store_allowed():
            client = _client(self.dir)
            exp = client.get_experiment_by_name(experiment)
            exp_id = exp.experiment_id if exp is not None else client.create_experiment(experiment)
            run = client.create_run(exp_id, run_name=name)
            self.client, self.run_id = client, run.info.run_id
            items = list(self.params.items())
            for i in range(0, len(items), 100):  # MLflow takes at most 100 params per batch
                client.log_batch(self.run_id, params=[Param(k, str(v)[:6000]) for k, v in items[i:i + 100]])
        self.closed = False

    def log(self, metrics: dict[str, float], step: int) -> None:
        """Log scalar ``metrics`` at ``step`` (names like ``train/loss``; ``/`` is kept in both stores)."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = []
        for key, value in metrics.items():
            value = float(value)
            self.writer.add_scalar(key, value, step)
            if math.isfinite(value):
                batch.append(Metric(key, value, now, int(step)))
            self.final[key] = value
        if batch:
            with _file_store_allowed():
                self.client.log_batch(self.run_id, metrics=batch)

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
        with _file_store_allowed():
            self.client.set_terminated(self.run_id, status)

    def __enter__(self) -> "Tracker":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close("FAILED" if exc_type is not None else "FINISHED")


def _runs(tracking_dir: str | os.PathLike, experiment: str):
    path = Path(tracking_dir).expanduser()
    if not (path / "mlruns").is_dir():
        raise FileNotFoundError(f"no MLflow store at {path / 'mlruns'}: train with TrainConfig(tracking_dir="
                                f"{str(path)!r}) first")
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


def runs_table(tracking_dir: str | os.PathLike, params: Iterable[str] | None = None,
               experiment: str = EXPERIMENT):
    """A pandas DataFrame with one row per tracked run (oldest first): ``run_name``, ``status``,
    ``run_id``, the parameters (all, or only those named in ``params``) and the final value of every metric.

    Parameter values come back as strings (MLflow stores them so); numbers are converted back where they
    parse as numbers."""
    import pandas as pd

    _, runs = _runs(tracking_dir, experiment)
    rows = []
    wanted = None if params is None else list(params)
    for run in runs:
        row: dict[str, Any] = {"run_name": run.info.run_name, "status": run.info.status}
        ps = run.data.params
        for k in (wanted if wanted is not None else sorted(ps)):
            row[k] = _parse(ps.get(k))
        row.update(sorted(run.data.metrics.items()))
        row["run_id"] = run.info.run_id
        rows.append(row)
    return pd.DataFrame(rows)


def metric_history(tracking_dir: str | os.PathLike, key: str, experiment: str = EXPERIMENT):
    """A long DataFrame (``run_name``, ``step``, ``value``) of metric ``key`` for every tracked run."""
    import pandas as pd

    client, runs = _runs(tracking_dir, experiment)
    rows = []
    for run in runs:
        with _file_store_allowed():
            history = client.get_metric_history(run.info.run_id, key)
        for m in sorted(history, key=lambda m: (m.step, m.timestamp)):
            rows.append({"run_name": run.info.run_name, "run_id": run.info.run_id, "step": m.step, "value": m.value})
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
