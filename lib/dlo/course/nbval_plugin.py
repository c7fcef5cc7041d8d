"""pytest plugin for ``make test``'s notebook stage (``-p dlo.course.nbval_plugin``).

1. nbval waits at most 5 s (hard-coded) between two output messages of a cell that has already finished; on a
   busy machine a cell's last outputs (a table, a progress bar's final state) can arrive later than that, and the
   cell then fails with "Timeout of 5 seconds exceeded waiting for output" although it ran correctly. This gives
   those messages a minute. The execution time limit of a cell (``--nbval-cell-timeout``) is not changed.
2. The stage runs three kinds of work in one pytest-xdist session: every notebook's cells under nbval (a notebook
   is one unit: its cells must run in order in one kernel), every notebook's dry-profile rehearsal and the
   wrong-answer corpus (each test its own unit). :class:`UnitScheduling` (xdist's scheduler hook) sends each unit
   whole to one worker, and the units are ordered longest first by :data:`SECONDS`, so that no long unit starts last and runs alone
   at the end while the other workers idle: the many short corpus tests come last and fill the gaps.
"""
from __future__ import annotations

import pytest

OUTPUT_TIMEOUT_S = 60

#: Seconds each long unit took in ``make test`` on a 2-core CPU (three workers): ``nb:<path>`` the notebook's smoke
#: run under nbval, ``dry:<path>`` its dry-profile rehearsal. Only the order matters; a unit not listed counts
#: :data:`DEFAULT_S`.
SECONDS = {
    "nb:Jour1/jour1.ipynb": 260, "nb:Jour4/hpo.ipynb": 170, "nb:Jour2/dataloader.ipynb": 120,
    "nb:tp_fsdp/fsdp.ipynb": 110, "nb:Jour4/inference.ipynb": 110, "nb:tp_pipeline/pipeline.ipynb": 70,
    "nb:Jour4/cifar_race.ipynb": 60, "nb:Jour3/optimizers.ipynb": 60, "nb:Jour2/ddp.ipynb": 60,
    "nb:Jour3/jit.ipynb": 50, "nb:Jour3/recipes.ipynb": 50, "nb:Jour2/augment.ipynb": 50,
    "dry:Jour1/jour1.ipynb": 170, "dry:tp_fsdp/fsdp.ipynb": 90, "dry:Jour4/hpo.ipynb": 120,
    "dry:Jour4/inference.ipynb": 78, "dry:Jour2/ddp.ipynb": 76, "dry:Jour3/optimizers.ipynb": 73,
    "dry:tp_pipeline/pipeline.ipynb": 72, "dry:Jour3/jit.ipynb": 67, "dry:Jour2/dataloader.ipynb": 64,
    "dry:Jour2/dp_scratch.ipynb": 50, "dry:Jour3/recipes.ipynb": 50, "dry:tp_tensor_parallel/tensor_parallel.ipynb": 41,
    "dry:tp_fsdp/apis.ipynb": 41, "dry:tp_pipeline/grid.ipynb": 40, "dry:Jour4/cifar_race.ipynb": 34,
    "dry:Jour2/augment.ipynb": 31,
}
DEFAULT_S = 20
_DRY_TEST = "test_the_full_profile_runs_on_a_cpu_scaled_down["


def unit_of(item) -> str:
    """The unit an item belongs to: ``nb:<path>`` for a notebook's cell, ``dry:<path>`` for a rehearsal, else its
    node id."""
    if type(item).__name__ == "IPyNbCell":
        return "nb:" + item.nodeid.split("::")[0]
    name = item.nodeid.split("::")[-1]
    if name.startswith(_DRY_TEST):
        return "dry:" + name[len(_DRY_TEST):-1]
    return item.nodeid


def estimate(unit: str) -> float:
    """:data:`SECONDS` of ``unit``; a notebook or rehearsal not listed :data:`DEFAULT_S`; any other test 1."""
    return SECONDS.get(unit, DEFAULT_S if unit.startswith(("nb:", "dry:")) else 1)


def pytest_collection_modifyitems(items) -> None:
    for item in items:
        if type(item).__name__ == "IPyNbCell" and hasattr(item, "output_timeout"):
            item.output_timeout = OUTPUT_TIMEOUT_S
    # longest unit first; a unit's items keep their order (sorted is stable), a notebook's cells stay together
    items.sort(key=lambda item: -estimate(unit_of(item)))


def _unit_of_nodeid(nodeid: str) -> str:
    path = nodeid.split("::")[0]
    return path if path.endswith(".ipynb") else nodeid


def pytest_xdist_make_scheduler(config, log):
    """With pytest-xdist: :class:`UnitScheduling` (a notebook's cells together, every other test alone)."""
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):
        """xdist's scope scheduling where the scope is the unit: a notebook, or a single test. Units are handed
        out in collection order (longest first, see above), one at a time to the worker that has the least
        pending, as xdist's ``--dist loadscope`` does."""

        def _split_scope(self, nodeid: str) -> str:
            return _unit_of_nodeid(nodeid)

    config.option.loadscopereorder = False  # keep the longest-first order of the collection
    return UnitScheduling(config, log)
