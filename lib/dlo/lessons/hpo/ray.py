"""Ray Tune: a private temp folder, start with retries, progress bar, PBT log, result tables.
"""
from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import re
import stat
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Mapping, Sequence


from dlo.runtime.paths import CACHE_DIR
from dlo.lessons.hpo.space import clip_to_space, grid, to_ray, validate_space


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


def private_dir(path: str | os.PathLike) -> Path:
    """``path`` as a folder only its owner can enter (mode 0700), created so from the start. An existing folder
    owned by another user is refused in one line (in a shared ``/tmp`` someone may have made it first, to read
    our token or plant files); ours with wider permissions is narrowed."""
    path = Path(path)
    try:
        path.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        pass
    st = path.lstat()
    if not stat.S_ISDIR(st.st_mode):
        raise PermissionError(f"{path} is not a folder (a link or a file): remove it or pass another temp_dir")
    if st.st_uid != os.getuid():
        raise PermissionError(f"{path} belongs to another user (uid {st.st_uid}): refusing to keep Ray's session and "
                              f"token there; remove it or pass temp_dir= a folder of your own")
    if st.st_mode & 0o077:
        path.chmod(0o700)
    return path


def private_token(path: str | os.PathLike) -> Path:
    """A random token in ``path``, readable by its owner only (mode 0600 from its creation: never a moment
    world-readable). An existing token that others could read, or that is not ours, is replaced."""
    path = Path(path)
    if path.exists() or path.is_symlink():
        st = path.lstat()
        if stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077:
            return path
        path.unlink()  # readable by others (or not ours): it may have been read; make a new one
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(uuid.uuid4().hex)
    return path


_RAY_START_ATTEMPTS = 3  # a start that fails (its node process died, or never registered) is tried again
_RAY_START_BACKOFF_S = 5.0  # pause before the 2nd try, doubled before the 3rd: the load that failed it may pass
#: How long a start may wait for its node to register while the node's process is alive (Ray's own limit is a fixed
#: 30 s, which a machine at load 10 on 2 cores can exceed); ``$DLO_RAY_START_TIMEOUT_S`` overrides it.
RAY_START_TIMEOUT_S = 300.0
#: The address every process of a local Ray listens on: this machine only (Ray would otherwise serve its GCS,
#: raylet, workers and Prometheus metrics endpoints on all interfaces, without authentication for the metrics).
LOOPBACK = "127.0.0.1"


class _RayNodeDied(Exception):
    """The raylet this process started exited before its node registered: no point in waiting longer."""


def _ray_children(name: str | None = None) -> list:
    """The Ray processes this process started (all of them, or those whose command line contains ``name``)."""
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil comes with ipykernel
        return []
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            command = " ".join(proc.cmdline())
        except psutil.Error:
            continue
        if any(key in command for key in ("gcs_server", "raylet", "/ray/", "ray::")) and (name is None or name in command):
            found.append(proc)
    return found


def _stop_ray_children() -> None:
    """Stop the Ray processes this process started (a half-started Ray, after a failed ``ray.init``)."""
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil comes with ipykernel
        return
    ours = _ray_children()
    for p in ours:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(ours, timeout=5)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=5)


def _start_timeout_s() -> float:
    value = os.environ.get("DLO_RAY_START_TIMEOUT_S")
    try:
        return float(value) if value else RAY_START_TIMEOUT_S
    except ValueError:
        raise ValueError(f"DLO_RAY_START_TIMEOUT_S must be a number of seconds, got {value!r}") from None


@contextlib.contextmanager
def _local_ray_settings(ray, timeout_s: float):
    """While ``ray.init`` starts a local node: its node address is the loopback one, and its wait for the node to
    register lasts while the raylet lives (up to ``timeout_s``), not Ray's fixed 30 s.

    Ray turns a loopback ``_node_ip_address`` into the machine's network address unless its single-machine switch
    (``ray_constants.ENABLE_RAY_CLUSTER``, read from ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` at import) is off; with it
    off, the GCS, the raylet, the workers and the metrics endpoints all bind to 127.0.0.1. Node start-up asks the
    GCS for its node in a loop (``services.get_node``) and gives up 30 s after the raylet started: each ask here
    waits, polling, while the raylet process is alive, so a slow machine is waited for and a dead raylet is reported
    at once. Both are put back afterwards. Either hook missing (another Ray version): Ray's own behaviour."""
    from ray._private import ray_constants, services

    saved_cluster = getattr(ray_constants, "ENABLE_RAY_CLUSTER", None)
    original = getattr(services, "get_node", None)
    deadline: list[float] = []

    def patient_get_node(*args, **kwargs):
        if not deadline:
            deadline.append(time.monotonic() + timeout_s)
        delay = 0.2
        while True:
            try:
                return original(*args, **kwargs)
            except RuntimeError:
                if not _ray_children("raylet/raylet"):
                    raise _RayNodeDied("Ray's node process (raylet) exited before it registered") from None
                if time.monotonic() > deadline[0]:
                    raise
                time.sleep(delay)
                delay = min(2.0, delay * 1.5)

    if saved_cluster is not None:
        ray_constants.ENABLE_RAY_CLUSTER = False
    if original is not None:
        services.get_node = patient_get_node
    try:
        yield
    finally:
        if saved_cluster is not None:
            ray_constants.ENABLE_RAY_CLUSTER = saved_cluster
        if original is not None:
            services.get_node = original


def _forget_failed_start(ray) -> None:
    """Drop what a failed ``ray.init`` left in this process. Its node had already made its GCS client the process's
    global one (``ray.experimental.internal_kv``) before it failed; once that GCS is stopped, the next Ray call that
    records a usage tag -- constructing any Tune scheduler does, ``PopulationBasedTraining`` included -- sends a
    synchronous request to it, which retries for 60 s and then aborts the whole process (a notebook's kernel, a
    test worker) with "Failed to connect to GCS". ``ray.shutdown()`` resets that state; the reset is repeated in
    case this Ray's shutdown skips it when nothing was connected."""
    with contextlib.suppress(Exception):
        ray.shutdown()
    with contextlib.suppress(ImportError, AttributeError):
        from ray.experimental import internal_kv

        internal_kv._internal_kv_reset()


def _raylet_death_reason(temp_dir: Path) -> str | None:
    """Why the raylet of the latest session in ``temp_dir`` died, in a few words, from its log (None: unknown).
    The usual one on a busy machine: Ray 2.60's raylet gives its dashboard and runtime-env agents a fixed ~15 s to
    write their port files (``agent_register_timeout_ms`` does not change it), and aborts when they are late."""
    log = temp_dir / "session_latest" / "logs" / "raylet.out"
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return None
    late = re.search(r"Timed out waiting for file \S*/(\w+?)_port_", text)
    if late:
        return f"its {late.group(1)} did not report its port within the raylet's fixed ~15 s"
    failed = re.search(r"Check failed: (.{0,120})", text)
    return f"raylet aborted: {failed.group(1)}" if failed else None


def _retryable(exc: BaseException) -> bool:
    """A start failure a busy machine explains: the node never registered, or its raylet died starting."""
    return isinstance(exc, _RayNodeDied) or "timed out during startup" in str(exc)


def _start_local_ray(ray, num_cpus: int, num_gpus: int | None, tmp, log_to_driver: bool):
    """``ray.init`` of a local Ray on the loopback address, tried again after a pause when a busy machine explains
    the failure (:func:`_retryable`), at most :data:`_RAY_START_ATTEMPTS` times; returns (context, attempts)."""
    import logging

    timeout_s = _start_timeout_s()
    attempt = 1
    while True:
        reason = None
        try:
            with _local_ray_settings(ray, timeout_s):
                ctx = ray.init(num_cpus=num_cpus, num_gpus=num_gpus, include_dashboard=False,
                               log_to_driver=log_to_driver, ignore_reinit_error=True, _temp_dir=str(tmp),
                               _node_ip_address=LOOPBACK, logging_level=logging.WARNING,
                               _system_config={"enable_metrics_collection": False,
                                               "worker_register_timeout_seconds": int(timeout_s)})
        except Exception as exc:  # noqa: BLE001 - Ray raises a bare Exception for this
            if not _retryable(exc):
                raise
            reason = str(exc).split(". ")[0].rstrip(".")
            why = _raylet_death_reason(tmp)
            reason = f"{reason}: {why}" if why else reason
        if reason is None:
            return ctx, attempt
        # out of the except block: the failure's traceback (which holds the half-made node and its GCS client) is
        # gone before its processes are stopped, and the error below does not carry it
        _forget_failed_start(ray)
        gc.collect()
        _stop_ray_children()
        load = f"load average {os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else "a busy machine"
        if attempt == _RAY_START_ATTEMPTS:
            raise RuntimeError(f"Ray did not start in {attempt} tries ({reason}; {load} for {os.cpu_count()} "
                               f"cores): try again when the machine is quieter, or raise DLO_RAY_START_TIMEOUT_S "
                               f"(now {timeout_s:.0f} s)")
        pause = _RAY_START_BACKOFF_S * 2 ** (attempt - 1)
        print(f"Ray did not start ({reason}; {load} for {os.cpu_count()} cores): trying again in {pause:.0f} s",
              file=sys.stderr, flush=True)
        time.sleep(pause)
        attempt += 1


def ray_start(num_cpus: int, num_gpus: int | None = None, temp_dir: str | os.PathLike | None = None,
              log_to_driver: bool = False) -> dict[str, Any]:
    """Start a local Ray for a notebook, or join the cluster named by ``$RAY_ADDRESS``; say what was started.

    ``num_cpus`` is the number of trials Ray may run at once with one CPU each (not the machine's core
    count, which on a shared node is not all yours). A local Ray listens on the loopback address only (127.0.0.1:
    its GCS, raylet, workers and metrics endpoints; other machines cannot reach it), with no dashboard, no metrics
    collection (nothing scrapes it, and it costs CPU), no usage statistics
    (``RAY_USAGE_STATS_ENABLED=0``: a compute node has no network), no idle workers started in advance
    (Tune's trials start their own, and on two cores those would only compete), Tune's compact output, and Ray's token
    authentication kept on (other users of a shared node cannot submit work to your Ray), with its token
    file in the temp folder rather than ``~/.ray``. ``log_to_driver=False`` keeps the trials' prints out
    of the notebook. On a busy machine the start waits for the node to register while its processes are alive (up
    to :data:`RAY_START_TIMEOUT_S`), and a start that fails anyway is cleaned up and tried again after a pause
    (3 tries); one limit remains, Ray's own: its raylet gives its agents a fixed ~15 s to report their ports, which a
    machine at load 10 or more on 2 cores can miss every time (the error then says so). When ``$RAY_ADDRESS`` is set (``slurm/ray_tune.sbatch`` exports it), Ray is already
    running on the allocation's nodes: this joins it, and the cluster's own CPUs and GPUs count.
    Returns ``{"address", "temp_dir", "num_cpus", "num_gpus", "seconds", "attempts"}``.
    """
    import logging

    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    os.environ.setdefault("RAY_prestart_worker_first_driver", "0")  # Tune's trials start their own workers anyway
    os.environ.setdefault("RAY_gcs_server_port_wait_time_s", "120")  # the GCS writes its port later on a busy machine
    start = time.perf_counter()
    attempt = 1
    if os.environ.get("RAY_ADDRESS"):
        ctx = ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=log_to_driver, ignore_reinit_error=True,
                       logging_level=logging.WARNING)
        tmp = None
    else:
        if not isinstance(num_cpus, int) or isinstance(num_cpus, bool) or num_cpus < 1:
            raise ValueError(f"num_cpus must be a positive integer, got {num_cpus!r}")
        tmp = private_dir(ray_temp_dir(temp_dir))
        if not ({"RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"} & set(os.environ)):
            # Ray would otherwise write one to ~/.ray/auth_token
            os.environ["RAY_AUTH_TOKEN_PATH"] = str(private_token(tmp / "auth_token"))
        auth_log = logging.getLogger("ray._private.authentication.authentication_token_setup")
        level = auth_log.level
        auth_log.setLevel(logging.ERROR)  # "token authentication is enabled": it is, on purpose
        try:
            ctx, attempt = _start_local_ray(ray, num_cpus, num_gpus, tmp, log_to_driver)
        finally:
            auth_log.setLevel(level)
    resources = ray.cluster_resources()
    return {"address": ctx.address_info.get("address"), "temp_dir": str(tmp) if tmp else None,
            "num_cpus": int(resources.get("CPU", 0)), "num_gpus": float(resources.get("GPU", 0)),
            "seconds": time.perf_counter() - start, "attempts": attempt}


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


def pbt_mutations(space: Mapping | Sequence) -> dict[str, Any]:
    """``hyperparam_mutations`` for Population Based Training from a search space: for a categorical or
    stepped parameter the list of its values (PBT's explore step then moves to a neighbouring value, or
    draws one anew: always a value of the space), for the others the :func:`to_ray` domain (PBT multiplies
    the value by 0.8 or 1.2, or draws it anew: pair it with :class:`KeepInSpace`)."""
    out: dict[str, Any] = {}
    domains = to_ray(space)
    for name, spec in validate_space(space).items():
        if spec["type"] == "categorical":
            out[name] = list(spec["choices"])
        elif spec.get("step") is not None:
            out[name] = grid(spec)
        else:
            out[name] = domains[name]
    return out


class KeepInSpace:
    """PBT's ``custom_explore_fn``: brings every explored value back inside the search space
    (:func:`~dlo.lessons.hpo.space.clip_to_space`). PBT's explore step multiplies a value by 1.2 without
    looking at the bounds: from a momentum of 0.9 that is 1.08, which the trainer rejects."""

    def __init__(self, space: Mapping | Sequence) -> None:
        self.space = validate_space(space)

    def __call__(self, config: dict[str, Any]) -> dict[str, Any]:
        return clip_to_space(config, self.space)


def pbt_scheduler(space: Mapping | Sequence, **kwargs: Any):
    """A ``PopulationBasedTraining`` scheduler that explores ``space`` and stays inside it:
    :func:`pbt_mutations` as its mutations and :class:`KeepInSpace` after each explore step. ``kwargs`` go to
    ``PopulationBasedTraining`` (``time_attr``, ``perturbation_interval``, ...)."""
    from ray.tune.schedulers import PopulationBasedTraining

    for key in ("hyperparam_mutations", "custom_explore_fn"):
        if key in kwargs:
            raise ValueError(f"pbt_scheduler sets {key} itself, from the space")
    return PopulationBasedTraining(hyperparam_mutations=pbt_mutations(space), custom_explore_fn=KeepInSpace(space),
                                   **kwargs)


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
