"""make test's notebook stage: a notebook's cells are one unit, every other test a unit alone, longest first."""
from types import SimpleNamespace

from dlo.course import nbval_plugin as P


class IPyNbCell(SimpleNamespace):  # the name is what the plugin recognises nbval's items by
    pass


def test_notebooks_longest_first_each_one_whole_and_in_order():
    items = [SimpleNamespace(nodeid="tests/test_x.py::test_y")]
    items += [IPyNbCell(nodeid=f"Jour1/shapes.ipynb::Cell {i}", output_timeout=5) for i in range(2)]
    items += [IPyNbCell(nodeid=f"Jour3/jit.ipynb::Cell {i}", output_timeout=5) for i in range(3)]
    items += [IPyNbCell(nodeid=f"Jour1/jour1.ipynb::Cell {i}", output_timeout=5) for i in range(3)]
    P.pytest_collection_modifyitems(items)
    assert [i.nodeid for i in items] == [f"Jour1/jour1.ipynb::Cell {i}" for i in range(3)] + [
        f"Jour3/jit.ipynb::Cell {i}" for i in range(3)] + [f"Jour1/shapes.ipynb::Cell {i}" for i in range(2)] + [
        "tests/test_x.py::test_y"]
    assert {i.output_timeout for i in items if isinstance(i, IPyNbCell)} == {P.OUTPUT_TIMEOUT_S}


def test_the_scheduler_keeps_a_notebook_on_one_worker_and_spreads_the_rest():
    values = {"tx": ["popen"] * 2, "numprocesses": 2}
    config = SimpleNamespace(option=SimpleNamespace(loadscopereorder=True, maxschedchunk=None, dist="load", **values),
                             getvalue=values.get)
    sched = P.pytest_xdist_make_scheduler(config, log=None)
    assert config.option.loadscopereorder is False
    assert sched._split_scope("Jour1/jour1.ipynb::Cell 7") == sched._split_scope("Jour1/jour1.ipynb::Cell 0")
    assert sched._split_scope("tests/t.py::test[0]") != sched._split_scope("tests/t.py::test[1]")
