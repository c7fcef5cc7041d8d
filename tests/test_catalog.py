"""The static step catalog (``dlo.course.catalog``) says what ``REGISTRY`` says, without importing the checkers;
the quick commands (``dlo hint``, ``dlo solution``, ``dlo check --list``, ``dlo --help``) never import torch."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from dlo.course import catalog
from dlo.runtime.paths import ROOT


def test_catalog_equals_the_registry():
    from dlo.course.checks import REGISTRY

    static = catalog.steps()
    assert list(static) == list(REGISTRY), "courses in another order than `dlo check --list` shows them"
    for course, steps in REGISTRY.items():
        assert list(static[course]) == list(steps), f"{course}: steps differ or are in another order"
        for step, chk in steps.items():
            assert static[course][step] == (course, step, chk.functions, chk.notebook), f"{course}/{step}"


def _plant(tmp_path, modules: dict[str, str]):
    """A checks-like folder: ``__init__.py`` and modules from their text. Returns its path."""
    for name, text in modules.items():
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(text))
    return tmp_path


def test_constants_keywords_and_import_order_are_followed(tmp_path):
    folder = _plant(tmp_path, {
        "__init__": "from .framework import register\nfrom . import (alpha, beta)\n",
        "framework": "def register(course, step, functions, notebook): ...\n",
        "beta": """
            BASE = "tp_x"
            NB: str = BASE + "/nb.ipynb"
            SCRIPT = f"{BASE}/train.py"
            FUNCS = ("f", "g")

            @register("beta", "one", FUNCS, NB)
            def _one(f, g): ...

            @register("beta", "two", functions=("h",), notebook=SCRIPT)
            def _two(h): ...
            """,
        # imports beta before registering anything: beta's steps come first, as when Python imports them
        "alpha": """
            from dlo.course.checks.beta import SCRIPT as OTHER
            from .framework import register

            @register(course="alpha", step="s", functions=["k"], notebook=OTHER)
            def _s(k): ...
            """,
    })
    table = catalog.steps(folder)
    assert list(table) == ["beta", "alpha"] and list(table["beta"]) == ["one", "two"]
    assert table["beta"]["one"] == ("beta", "one", ("f", "g"), "tp_x/nb.ipynb")
    assert table["beta"]["two"] == ("beta", "two", ("h",), "tp_x/train.py")
    assert table["alpha"]["s"] == ("alpha", "s", ("k",), "tp_x/train.py")
    assert catalog.find("alpha", "s", folder) is table["alpha"]["s"] and catalog.find("alpha", "x", folder) is None


@pytest.mark.parametrize("text, why", [
    ('from pathlib import Path\n\nNB = str(Path("a") / "b.ipynb")\n\n@register("c", "s", ("f",), NB)\ndef _s(f): ...\n',
     "NB is not a module-level constant"),
    ('NB = "a.ipynb"\nNB = make()\n\n@register("c", "s", ("f",), NB)\ndef _s(f): ...\n',
     "NB is not a module-level constant"),  # rebound to something that needs running
    ('@register("c", "s", ("f",), notebook=pick("a.ipynb"))\ndef _s(f): ...\n', "Call is not a literal"),
])
def test_an_unresolvable_argument_names_its_file_and_line(tmp_path, text, why):
    folder = _plant(tmp_path, {"__init__": "from . import mod\n", "mod": text})
    line = text.splitlines().index(next(t for t in text.splitlines() if t.startswith("@register"))) + 1
    with pytest.raises(catalog.CatalogError) as info:
        catalog.steps(folder)
    assert f"mod.py:{line}: @register argument notebook=" in str(info.value)
    assert why in str(info.value) and "cannot be resolved statically" in str(info.value)


def test_a_malformed_register_call_is_refused(tmp_path):
    folder = _plant(tmp_path, {"__init__": "from . import mod\n",
                               "mod": '@register("c", "s", "f", "a.ipynb")\ndef _s(f): ...\n'})
    with pytest.raises(catalog.CatalogError, match=r"mod\.py:1: @register's functions must be a tuple of names"):
        catalog.steps(folder)


# --------------------------------------------------------------------------------------------------
# The quick commands start without torch
# --------------------------------------------------------------------------------------------------

_RUN_MAIN = """
import sys
from dlo.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:  # --help and argparse's usage errors
    code = exc.code
loaded = sorted(m for m in ("torch", "torchvision") if m in sys.modules)
print(f"exit={code} loaded={','.join(loaded) or '-'}", file=sys.stderr)
"""


@pytest.mark.parametrize("args, code, out", [
    (("hint", "jour1", "channels_last"), 0, "Hint 1/3 for jour1/channels_last:"),
    (("solution", "jour1", "channels_last"), 0, "# jour1/channels_last, in to_channels_last:"),
    (("check", "--list"), 0, "jour1: device amp"),
    (("check", "tp"), 0, "tp: 1 2 3"),
    (("--help",), 0, "usage: dlo"),
    (("slurm", "--help"), 0, "usage: dlo slurm"),
    (("hint", "jour9", "x"), 2, ""),
    (("check", "jour9"), 2, ""),  # an unknown course: one error line, not an empty list
])
def test_quick_commands_do_not_import_torch(tmp_path, args, code, out):
    env = {**os.environ, "DLO_RUNS_DIR": str(tmp_path)}  # a throwaway hint state
    res = subprocess.run([sys.executable, "-c", _RUN_MAIN, *args], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, env=env)
    assert res.stderr.strip().splitlines()[-1] == f"exit={code} loaded=-", res.stderr[-2000:]
    assert out in res.stdout


def test_an_unknown_course_in_check_is_one_line_naming_the_courses(capsys):
    from dlo.cli import main

    assert main(["check", "nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: unknown course 'nope': ") and "the courses are " in err[0] and "jour1" in err[0]
