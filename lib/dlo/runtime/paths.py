"""Where the workbook keeps things: project root, caches, run outputs, data.

All caches live in the project's ignored ``.cache/`` folder, so runs never litter ``$HOME`` or ``/tmp``.
An environment variable that is already set always wins (a cluster may point caches at a scratch disk).
"""
from __future__ import annotations

import os
from pathlib import Path

_PKG = Path(__file__).resolve().parent


def _find_root() -> Path:
    """The checkout's root when dlo is installed editable from ``lib/``; else the working directory."""
    env = os.environ.get("DLO_ROOT")
    if env:
        return Path(env).resolve()
    candidate = _PKG.parent.parent.parent  # lib/dlo/runtime -> lib/dlo -> lib -> root
    if (candidate / "lib" / "dlo").is_dir() and (candidate / "pyproject.toml").is_file():
        return candidate
    return Path.cwd().resolve()


ROOT: Path = _find_root()
#: The folder that holds the ``dlo`` package (``lib/`` in a checkout).
LIB_DIR: Path = _PKG.parent.parent
CACHE_DIR: Path = Path(os.environ.get("DLO_CACHE_DIR", ROOT / ".cache"))
RUNS_DIR: Path = Path(os.environ.get("DLO_RUNS_DIR", ROOT / "runs"))

_CACHE_VARS = {
    "TORCHINDUCTOR_CACHE_DIR": "torchinductor",
    "TORCH_EXTENSIONS_DIR": "torch_extensions",
    "MPLCONFIGDIR": "matplotlib",
    "TRITON_CACHE_DIR": "triton",
}


def setup_caches() -> dict[str, str]:
    """Point torch/matplotlib caches into ``CACHE_DIR`` unless already set. Returns what is in force."""
    out = {}
    for var, sub in _CACHE_VARS.items():
        if not os.environ.get(var):
            path = CACHE_DIR / sub
            path.mkdir(parents=True, exist_ok=True)
            os.environ[var] = str(path)
        out[var] = os.environ[var]
    return out


def run_dir(name: str, base: str | os.PathLike | None = None) -> Path:
    """``runs/<name>/``, created. Executed notebooks, JSON records, plots and traces go there."""
    path = Path(base) if base is not None else RUNS_DIR / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def probe_writable(folder: str | os.PathLike, *, create: bool = True) -> Path:
    """Check that files can be created in ``folder`` (made first when ``create``) by writing and removing a
    hidden probe file; raises the ``OSError`` that a real write would raise, so that a caller can turn it into
    its own one-line error *before* minutes of work are spent."""
    import uuid

    folder = Path(folder)
    if create:
        folder.mkdir(parents=True, exist_ok=True)
    probe = folder / f".write-probe-{uuid.uuid4().hex[:8]}"
    probe.touch()
    probe.unlink()
    return folder


def env_with_dlo(env: dict[str, str] | None = None, **extra: str) -> dict[str, str]:
    """``env`` (default: this process's environment) plus ``extra``, with the folder holding ``dlo`` first on
    PYTHONPATH: a ``python -m dlo ...`` started with it imports this very ``dlo``, installed or not (a GPU node's
    bare Python with ``PYTHONPATH=lib``)."""
    out = dict(os.environ if env is None else env)
    out["PYTHONPATH"] = os.pathsep.join(filter(None, [str(LIB_DIR), out.get("PYTHONPATH")]))
    out.update(extra)
    return out
