"""Plain papermill sees every notebook parameter: ``papermill --help-notebook`` lists each parameter that
``dlo run`` knows, with its type and its comment as help, so a batch user of papermill reads the same interface."""
from __future__ import annotations

import logging
import shutil
import subprocess
import sys

import pytest

from dlo.course.notebooks import parameter_types, parameters_of, source_notebooks

papermill = pytest.importorskip("papermill")
NOTEBOOKS = source_notebooks()


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.parent.name + "/" + p.name)
def test_papermill_reads_every_parameter_with_its_type_and_help(nb, caplog):
    with caplog.at_level(logging.WARNING, logger="papermill"):
        seen = papermill.inspect_notebook(str(nb))
    ours = parameters_of(nb)
    assert list(seen) == list(ours), f"{nb}: papermill reads {list(seen)}, dlo run knows {list(ours)}"
    types = parameter_types(nb)
    for name, p in seen.items():
        assert p["help"], f"{nb}: parameter {name} has no comment for papermill's help"
        if types[name] and type(None) in types[name]:
            assert p["inferred_type_name"].startswith("Optional["), (name, p["inferred_type_name"])
        elif types[name]:
            assert p["inferred_type_name"] != "None", f"{nb}: papermill sees no type for {name}"


def test_the_command_line_lists_them_too():
    exe = shutil.which("papermill") or str(__import__("pathlib").Path(sys.executable).with_name("papermill"))
    nb = next(p for p in NOTEBOOKS if p.name == "jour1.ipynb")
    out = subprocess.run([exe, "--help-notebook", str(nb)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for name in parameters_of(nb):
        assert f"  {name}: " in out.stdout, f"{name} missing from papermill --help-notebook:\n{out.stdout}"


def test_dlo_reads_the_quoted_annotations_papermill_needs():
    import ast

    from dlo.course.notebooks import _annotation_types

    def types(text):
        return _annotation_types(ast.parse(f"x: {text} = None").body[0].annotation)

    assert types('"Optional[int]"') == (int, type(None))
    assert types('"Optional[Union[int, str]]"') == (int, str, type(None))
    assert types("int | None") == (int, type(None))
    assert types('"Optional[list]"') == (list, type(None))
    assert types('"Optional[Foo]"') is None
