"""make test's notebook stage: its units (a notebook's cells together, every other test alone), longest first."""
from types import SimpleNamespace

from dlo.course import nbval_plugin as P


class IPyNbCell(SimpleNamespace):  # the name is what the plugin recognises nbval's items by
    pass


def _items():
    cells = [IPyNbCell(nodeid=f"Jour3/jit.ipynb::Cell {i}") for i in range(3)]
    cells += [IPyNbCell(nodeid=f"Jour1/jour1.ipynb::Cell {i}") for i in range(3)]
    dry = [SimpleNamespace(nodeid=f"tests/test_dry_profiles.py::{P._DRY_TEST}{nb}]")
           for nb in ("Jour1/shapes.ipynb", "Jour4/hpo.ipynb")]
    corpus = [SimpleNamespace(nodeid=f"tests/test_wrong_answers.py::test_x[{i}]") for i in range(2)]
    return corpus + cells + dry


def test_units_and_their_order():
    items = _items()
    assert P.unit_of(items[2]) == "nb:Jour3/jit.ipynb" and P.unit_of(items[-1]) == "dry:Jour4/hpo.ipynb"
    P.pytest_collection_modifyitems(items)
    order = [i.nodeid for i in items]
    # jour1's smoke run (longest), hpo's rehearsal, jit's notebook, shapes' rehearsal (unlisted: the default), corpus
    assert order[:3] == [f"Jour1/jour1.ipynb::Cell {i}" for i in range(3)]
    assert order[3].endswith("[Jour4/hpo.ipynb]")
    assert order[4:7] == [f"Jour3/jit.ipynb::Cell {i}" for i in range(3)]  # a notebook's cells stay together, in order
    assert order[7].endswith("[Jour1/shapes.ipynb]") and order[8:] == ["tests/test_wrong_answers.py::test_x[0]",
                                                                       "tests/test_wrong_answers.py::test_x[1]"]


def test_the_scheduler_keeps_a_notebook_on_one_worker_and_spreads_the_rest():
    assert P._unit_of_nodeid("Jour1/jour1.ipynb::Cell 7") == P._unit_of_nodeid("Jour1/jour1.ipynb::Cell 0")
    a, b = "tests/test_wrong_answers.py::test_x[0]", "tests/test_wrong_answers.py::test_x[1]"
    assert P._unit_of_nodeid(a) != P._unit_of_nodeid(b)
    values = {"tx": ["popen"] * 3, "numprocesses": 3}
    config = SimpleNamespace(option=SimpleNamespace(loadscopereorder=True, maxschedchunk=None, dist="load", **values),
                             getvalue=values.get)
    sched = P.pytest_xdist_make_scheduler(config, log=None)
    assert config.option.loadscopereorder is False and sched._split_scope("Jour1/jour1.ipynb::Cell 3") == \
        "Jour1/jour1.ipynb"
