"""Layer 1, runtime: where a run happens -- the device, the distributed context (torchrun or Slurm) and its
process groups (one ``Grid`` lays out every dp × pp × cp × tp job), the launcher that starts N ranks from a
notebook, the ranks' JSON records, paths and caches, sbatch templates.
"""
from __future__ import annotations

from .device import DEVICE_ENV, pick_device, synchronize
from .context import (
    DEFAULT_MASTER_ADDR, DEFAULT_MASTER_PORT, DistContext, dist_context, expand_nodelist, rank_and_world,
    is_main_process,
)
from .distributed import init_distributed, teardown, exit_after_success, distributed, free_port
from .records import RECORDS_ENV, write_record, read_records
from .launch import LaunchError, build_launch_command, check_processes, expand_runs, launch
from .grid import AXES, Grid
from .errors import first_line
from .validate import (
    is_int, is_number, positive_int, check_choice, non_negative_int, check_batch_divisible, per_rank_batch,
)

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
    "is_int",
    "is_number",
    "positive_int",
    "check_choice",
    "non_negative_int",
    "check_batch_divisible",
    "per_rank_batch",
]
