"""What a result is stored with, and how: the environment (versions, device, cores), JSON written atomically
and read back with a one-line error, records as a pandas table, and a temporary thread count.

Split from :mod:`dlo.measure.bench` (the timing itself); every name here is importable from there too.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator

import torch
from dlo.runtime.atomic import atomic_write_text
import dlo


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bf16 natively (AVX512-BF16 or AMX, used by oneDNN). Without it,
    bf16 autocast on CPU is emulated and usually much *slower* than fp32."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # pragma: no cover - builds without oneDNN
        return False


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


def table(records: Iterable[Any], columns: list[str] | None = None):
    """Records (or Measurements: anything with ``to_record()``) as a pandas DataFrame, one row each."""
    import pandas as pd

    rows = [r.to_record() if hasattr(r, "to_record") else dict(r) for r in records]
    for r in rows:
        extra = r.pop("extra", None) or {}
        for k, v in extra.items():
            r.setdefault(k, v)
        r.pop("times_s", None)
        r.pop("warmup_times_s", None)
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
