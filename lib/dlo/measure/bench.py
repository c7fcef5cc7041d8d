"""Honest timing: synchronised, warm-up excluded, repeated, median reported.

Why each rule matters:
- GPU work is asynchronous: Python returns as soon as kernels are *queued*. Timing without a
  synchronisation measures the queueing, not the work. On CUDA we time with CUDA events (recorded in the
  stream, read after a synchronize); on CPU, ``time.perf_counter`` around a synchronised call.
- The first calls pay one-off costs (cuDNN autotuning, torch.compile, allocator growth, lazy inits):
  warm-up calls are run and discarded.
- A single measurement is noisy (other processes, clocks, the OS): we repeat and report the median,
  which, unlike the mean, ignores the odd slow outlier.

Every measurement becomes a plain dict ("record") that can be written to JSON and collected in a
pandas table, so numbers shown in a notebook come from the run that shows them.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import statistics
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import torch
from dlo.runtime.atomic import atomic_write_text
from dlo.runtime.device import synchronize
import dlo


def time_calls(fn: Callable[[], Any], *, warmup: int = 1, repeats: int = 5,
               device: torch.device | str | None = None, progress: str | None = None) -> list[float]:
    """Run ``fn`` ``warmup`` times untimed, then ``repeats`` times timed. Returns seconds per call.

    On CUDA each call is bracketed by CUDA events; elsewhere by ``perf_counter`` after a synchronize.
    ``progress`` shows a tqdm bar with that description.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    dev = torch.device(device) if device is not None else torch.device("cpu")
    iterator: Iterable[int] = range(warmup + repeats)
    if progress:
        from tqdm.auto import tqdm
        iterator = tqdm(iterator, desc=progress, leave=False)
    times: list[float] = []
    use_events = dev.type == "cuda"
    for i in iterator:
        if use_events:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            elapsed = start.elapsed_time(end) / 1000.0
        else:
            synchronize(dev)
            t0 = time.perf_counter()
            fn()
            synchronize(dev)
            elapsed = time.perf_counter() - t0
        if i >= warmup:
            times.append(elapsed)
    return times


class PeakMemory:
    """Peak memory while the ``with`` block runs.

    CUDA: ``torch.cuda.max_memory_allocated`` after a reset (memory held by tensors; the caching
    allocator reserves a bit more). CPU: the process's resident set size (RSS) sampled every few
    milliseconds by a background thread: the whole process, Python included, so compare
    configurations with each other rather than reading it as the model's footprint.
    """

    def __init__(self, device: torch.device | str = "cpu", interval_s: float = 0.005) -> None:
        self.device = torch.device(device)
        self.interval_s = interval_s
        self.peak_bytes = 0
        self.kind = "cuda_max_allocated" if self.device.type == "cuda" else "cpu_rss_peak"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "PeakMemory":
        if self.device.type == "cuda":
            synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            import psutil

            proc = psutil.Process()
            self.peak_bytes = proc.memory_info().rss

            def sample() -> None:
                while not self._stop.is_set():
                    self.peak_bytes = max(self.peak_bytes, proc.memory_info().rss)
                    self._stop.wait(self.interval_s)

            self._thread = threading.Thread(target=sample, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device.type == "cuda":
            synchronize(self.device)
            self.peak_bytes = int(torch.cuda.max_memory_allocated(self.device))
        else:
            self._stop.set()
            if self._thread is not None:
                self._thread.join()


@dataclass
class Measurement:
    """One timed configuration. ``throughput`` is ``items_per_call / median_s`` (e.g. images/s)."""

    name: str
    times_s: list[float]
    items_per_call: int
    unit: str = "img/s"
    peak_memory_bytes: int | None = None
    memory_kind: str | None = None
    device: str = "cpu"
    warmup: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def median_s(self) -> float:
        return statistics.median(self.times_s)

    @property
    def throughput(self) -> float:
        return self.items_per_call / self.median_s

    def to_record(self) -> dict[str, Any]:
        rec = asdict(self)
        rec.update(median_s=self.median_s, throughput=self.throughput, repeats=len(self.times_s))
        return rec

    def __str__(self) -> str:
        mem = f", peak mem {self.peak_memory_bytes / 2**20:.0f} MiB ({self.memory_kind})" if self.peak_memory_bytes else ""
        return (f"{self.name}: {self.throughput:,.1f} {self.unit} (median of {len(self.times_s)} "
                f"after {self.warmup} warm-up, {self.median_s * 1000:.1f} ms/call{mem})")


def measure(name: str, fn: Callable[[], Any], *, items_per_call: int, warmup: int = 1, repeats: int = 5,
            device: torch.device | str = "cpu", unit: str = "img/s", track_memory: bool = True,
            progress: bool = True, **extra: Any) -> Measurement:
    """Time ``fn`` (see :func:`time_calls`) and track its peak memory; returns a :class:`Measurement`."""
    device = torch.device(device)
    if track_memory:
        with PeakMemory(device) as mem:
            times = time_calls(fn, warmup=warmup, repeats=repeats, device=device,
                               progress=name if progress else None)
        peak, kind = mem.peak_bytes, mem.kind
    else:
        times = time_calls(fn, warmup=warmup, repeats=repeats, device=device, progress=name if progress else None)
        peak, kind = None, None
    return Measurement(name=name, times_s=times, items_per_call=items_per_call, unit=unit, peak_memory_bytes=peak,
                       memory_kind=kind, device=str(device), warmup=warmup, extra=dict(extra))


def measure_steps(name: str, step: Callable[[torch.Tensor, torch.Tensor], Any],
                  batches: list[tuple[torch.Tensor, torch.Tensor]], *, warmup: int = 1, repeats: int = 5,
                  device: torch.device | str = "cpu", **extra: Any) -> Measurement:
    """Time ``step(images, labels)`` on pre-loaded ``batches`` (cycled), in images per second.

    Batches are already on the device, so this measures the training step alone: the data pipeline
    is a separate question (Jour2)."""
    if not batches:
        raise ValueError("measure_steps needs at least one pre-loaded batch")
    state = {"i": 0}

    def call() -> None:
        images, labels = batches[state["i"] % len(batches)]
        state["i"] += 1
        step(images, labels)

    extra.setdefault("batch_size", len(batches[0][0]))
    return measure(name, call, items_per_call=len(batches[0][0]), warmup=warmup, repeats=repeats, device=device,
                   **extra)


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bf16 natively (AVX512-BF16 or AMX, used by oneDNN). Without it,
    bf16 autocast on CPU is emulated and usually much *slower* than fp32."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # pragma: no cover - builds without oneDNN
        return False


class Ladder:
    """An optimisation ladder: each step is measured on top of the fastest configuration so far and
    *kept* only if it beats it on this machine (a change that helps on a GPU can hurt on a CPU).

    ``current`` is the configuration the next step builds on; ``record`` adds a row (a Measurement, or
    ``None`` with a reason when the step does not apply here) and updates ``current`` when kept.
    """

    def __init__(self, **initial_config: Any) -> None:
        self.rows: list[dict[str, Any]] = []
        self.current: dict[str, Any] = dict(initial_config)

    def best(self) -> dict[str, Any] | None:
        kept = [r for r in self.rows if r["kept"]]
        return max(kept, key=lambda r: r["throughput"]) if kept else None

    def record(self, step: str, measurement: Measurement | None = None, reason: str | None = None,
               **config: Any) -> dict[str, Any]:
        row: dict[str, Any] = {"step": step, "applicable": measurement is not None, "reason": reason,
                               "kept": False, **config}
        if measurement is None:
            if not reason:
                raise ValueError(f"step {step!r}: give a measurement, or the reason it does not apply here")
            print(f"{step}: not applicable here -- {reason}")
        else:
            row.update(measurement.to_record())
            best = self.best()
            row["kept"] = best is None or measurement.throughput > best["throughput"]
            if row["kept"]:
                self.current.update(config)
            print(measurement, "-> kept" if row["kept"] else "-> slower than the best so far: not kept")
        self.rows.append(row)
        return row

    def table(self):
        """All rows, with the speed-up over the first (baseline) row."""
        import pandas as pd

        df = pd.DataFrame(self.rows)
        if "throughput" in df and len(df):
            df["speedup"] = df["throughput"] / df["throughput"].iloc[0]
        return df

    def summary(self) -> dict[str, Any]:
        """The configuration the ladder ends with and its speed-up over the baseline."""
        kept = [r for r in self.rows if r["kept"]]
        if not kept:
            raise ValueError("the ladder has no measured step yet")
        base = self.rows[0]["throughput"]
        return {"final_config": dict(self.current), "final_step": kept[-1]["step"],
                "final_speedup": kept[-1]["throughput"] / base,
                "steps_not_kept": [r["step"] for r in self.rows if r["applicable"] and not r["kept"]]}


def environment_info(device: torch.device | str | None = None) -> dict[str, Any]:
    """What a result depends on: versions, device name, core count, date. Stored with every result file."""

    try:
        import torchvision

        tv = torchvision.__version__
    except Exception:  # pragma: no cover - reported, not fatal
        tv = None
    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    info: dict[str, Any] = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": tv,
        "dlo": dlo.__version__,
        "device": str(dev),
        "cpu": platform.processor() or platform.machine(),
        "cpu_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_native_bf16": cpu_has_native_bf16(),
    }
    if dev.type == "cuda":
        info.update(gpu=torch.cuda.get_device_name(dev), cuda=torch.version.cuda,
                    cudnn=torch.backends.cudnn.version(),
                    gpu_memory_gib=round(torch.cuda.get_device_properties(dev).total_memory / 2**30, 1))
    else:
        info["gpu"] = None
    return info


def save_json(payload: Any, path: str | os.PathLike) -> Path:
    """Write JSON atomically (see :func:`dlo.runtime.atomic.atomic_write`), creating the folder."""
    return atomic_write_text(path, json.dumps(payload, indent=2, default=str) + "\n")


def load_json(path: str | os.PathLike) -> Any:
    """The JSON in ``path``; a file that is not JSON is a one-line ValueError naming it."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path} is not a JSON file ({exc}): write it again with save_json") from None


def table(records: Iterable[dict[str, Any] | Measurement], columns: list[str] | None = None):
    """Records (or Measurements) as a pandas DataFrame, one row each."""
    import pandas as pd

    rows = [r.to_record() if isinstance(r, Measurement) else dict(r) for r in records]
    for r in rows:
        extra = r.pop("extra", None) or {}
        for k, v in extra.items():
            r.setdefault(k, v)
        r.pop("times_s", None)
    df = pd.DataFrame(rows)
    return df[columns] if columns else df


@contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Temporarily set the number of intra-op CPU threads (None: leave as is)."""
    if n is None:
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)
