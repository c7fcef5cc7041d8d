"""pytest plugin for ``make test``'s notebook run (``-p dlo.course.nbval_plugin``).

nbval waits at most 5 s (hard-coded) between two output messages of a cell that has already finished; on a
busy machine a cell's last outputs (a table, a progress bar's final state) can arrive later than that, and the
cell then fails with "Timeout of 5 seconds exceeded waiting for output" although it ran correctly. This gives
those messages a minute. The execution time limit of a cell (``--nbval-cell-timeout``) is not changed.
"""
from __future__ import annotations

OUTPUT_TIMEOUT_S = 60


def pytest_collection_modifyitems(items) -> None:
    for item in items:
        if type(item).__name__ == "IPyNbCell" and hasattr(item, "output_timeout"):
            item.output_timeout = OUTPUT_TIMEOUT_S
