"""Layer 1, runtime: where a run happens -- the device, the distributed context (torchrun or Slurm) and its
process groups (one ``Grid`` lays out every dp × pp × cp × tp job), the launcher that starts N ranks from a
notebook, the ranks' JSON records, paths and caches, sbatch templates.

The names below are imported from their module on first use (PEP 562), not when the package is: ``import dlo``
imports ``dlo.runtime.paths`` and hence this package, and ``dlo hint`` or ``dlo --help`` must not pay for torch.
"""
from __future__ import annotations

import importlib
import os
import sys
import types

#: Each re-exported name -> the submodule that defines it.
_EXPORTS = {
    **dict.fromkeys(("DEVICE_ENV", "pick_device", "synchronize"), "device"),
    **dict.fromkeys(("DEFAULT_MASTER_ADDR", "DEFAULT_MASTER_PORT", "DistContext", "dist_context", "expand_nodelist",
                     "rank_and_world", "is_main_process", "free_port"), "context"),
    **dict.fromkeys(("init_distributed", "teardown", "exit_after_success", "distributed"), "distributed"),
    **dict.fromkeys(("RECORDS_ENV", "write_record", "read_records"), "records"),
    **dict.fromkeys(("build_launch_command", "launch"), "launch"),
    **dict.fromkeys(("LaunchError",), "launch_report"),
    **dict.fromkeys(("check_processes", "expand_runs"), "launch_request"),
    **dict.fromkeys(("AXES", "Grid"), "grid"),
    **dict.fromkeys(("first_line", "TooFewGPUs"), "errors"),
    **dict.fromkeys(("is_int", "is_number", "positive_int", "check_choice", "non_negative_int",
                     "check_batch_divisible", "per_rank_batch"), "validate"),
}

#: Submodules that the package used to import eagerly: ``dlo.runtime.device`` etc. stay reachable as attributes.
_SUBMODULES = frozenset(_EXPORTS.values())

__all__ = [
    "AXES",
    "Grid",
    "DEVICE_ENV",
    "pick_device",
    "synchronize",
    "DEFAULT_MASTER_ADDR",
    "DEFAULT_MASTER_PORT",
    "DistContext",
    "dist_context",
    "expand_nodelist",
    "rank_and_world",
    "is_main_process",
    "init_distributed",
    "teardown",
    "exit_after_success",
    "distributed",
    "free_port",
    "check_processes",
    "RECORDS_ENV",
    "write_record",
    "read_records",
    "LaunchError",
    "build_launch_command",
    "expand_runs",
    "launch",
    "first_line",
    "TooFewGPUs",
    "is_int",
    "is_number",
    "positive_int",
    "check_choice",
    "non_negative_int",
    "check_batch_divisible",
    "per_rank_batch",
]


def __getattr__(name: str):
    """Returns the re-exported ``name`` (or the submodule ``name``), importing its module on first use."""
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # next time a plain attribute, without this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _Facade(types.ModuleType):
    """This package's module type: ``distributed`` and ``launch`` stay the functions of those names.

    Importing the submodule ``dlo.runtime.launch`` (as ``from dlo.runtime.launch import ...`` does) binds the
    package's attribute ``launch`` to that module. The eager imports this file used to make then rebound it to the
    function, and notebooks rely on ``from dlo.runtime import launch`` being the function: keep it so.
    """

    def __setattr__(self, name: str, value) -> None:
        if (name in _EXPORTS and _EXPORTS[name] == name and isinstance(value, types.ModuleType)
                and value.__name__ == f"{__name__}.{name}"):
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Facade

# A rank started by launch() must get the records' failure hook from its first `import dlo.runtime`, as when
# this package imported every module (that rank imports torch anyway). "DLO_RECORDS_DIR" is records.RECORDS_ENV.
if os.environ.get("DLO_RECORDS_DIR"):
    from . import records  # noqa: E402,F401
