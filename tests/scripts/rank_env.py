"""Worker for tests/test_launch_safety.py: the rank variables (and HOME) each rank finds in its environment."""
import os

import dlo  # noqa: F401
from dlo.runtime import write_record

NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "TORCHELASTIC_RUN_ID", "HOME")
write_record({"env": {name: os.environ.get(name) for name in NAMES}})
