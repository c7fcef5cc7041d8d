"""pytest plugin for ``make test``'s notebook stage (``-p dlo.course.nbval_plugin``).

1. nbval waits at most 5 s (hard-coded) between two output messages of a cell that has already finished; on a
   busy machine a cell's last outputs (a table, a progress bar's final state) can arrive later than that, and the
   cell then fails with "Timeout of 5 seconds exceeded waiting for output" although it ran correctly. This gives
   those messages a minute. The execution time limit of a cell (``--nbval-cell-timeout``) is not changed.
2. With pytest-xdist, a notebook is one unit (its cells must run in order in one kernel) and any other test is a
   unit alone (:func:`pytest_xdist_make_scheduler`); the notebooks are handed out longest first (:data:`SECONDS`),
   so that no long notebook starts last and runs alone at the end while the other workers idle.
"""
from __future__ import annotations

OUTPUT_TIMEOUT_S = 60

#: Seconds each notebook's smoke run took under nbval in ``make test`` (2-core CPU, two workers). Only the order
#: matters; a notebook not listed counts :data:`DEFAULT_S`.
SECONDS = {
    "Jour1/jour1.ipynb": 260, "Jour4/hpo.ipynb": 170, "Jour2/dataloader.ipynb": 120, "tp_fsdp/fsdp.ipynb": 110,
    "Jour4/inference.ipynb": 110, "Jour3/optimizers.ipynb": 90, "tp_pipeline/pipeline.ipynb": 70,
    "Jour4/cifar_race.ipynb": 60, "Jour2/ddp.ipynb": 60, "Jour2/dp_scratch.ipynb": 55, "Jour3/jit.ipynb": 50,
    "Jour3/recipes.ipynb": 50, "Jour2/augment.ipynb": 50,
}
DEFAULT_S = 20


def unit_of(nodeid: str) -> str:
    """The unit of a test: its notebook for a notebook's cell (``Jour1/jour1.ipynb::Cell 3``), else the test."""
    path = nodeid.split("::")[0]
    return path if path.endswith(".ipynb") else nodeid


def estimate(unit: str) -> float:
    """:data:`SECONDS` of a notebook (:data:`DEFAULT_S` if not listed); any other test 1."""
    return SECONDS.get(unit, DEFAULT_S if unit.endswith(".ipynb") else 1)


def pytest_collection_modifyitems(items) -> None:
    for item in items:
        if type(item).__name__ == "IPyNbCell" and hasattr(item, "output_timeout"):
            item.output_timeout = OUTPUT_TIMEOUT_S
    # longest unit first; a unit's items keep their order (sorted is stable), a notebook's cells stay together
    items.sort(key=lambda item: -estimate(unit_of(item.nodeid)))


def pytest_xdist_make_scheduler(config, log):
    """With pytest-xdist: xdist's scope scheduling where the scope is the unit (:func:`unit_of`), handed out in
    collection order (longest first, above) to the worker with the least pending."""
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    config.option.loadscopereorder = False  # keep the longest-first order of the collection
    return UnitScheduling(config, log)
