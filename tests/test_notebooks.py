"""Notebooks: committed clean, student versions up to date, solution-region syntax, the papermill runner."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dlo.course import notebooks as nbs
from dlo.course import runner
from dlo.runtime.paths import ROOT
from dlo.course import student as stu

FIXTURES = Path(__file__).parent / "fixtures"


def tracked_notebooks() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "*.ipynb"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [ROOT / p for p in out.stdout.split()]


def test_there_are_course_notebooks():
    assert ROOT / "Jour1" / "jour1.ipynb" in nbs.source_notebooks()


def test_committed_notebooks_carry_no_outputs():
    assert runner.check_clean(tracked_notebooks()) == []


def test_student_notebooks_are_up_to_date():
    stale = stu.write_students(check_only=True)
    assert stale == [], f"stale student notebooks (run `make student`): {stale}"


@pytest.mark.parametrize("nb", nbs.source_notebooks(), ids=lambda p: p.stem)
def test_source_notebook_structure(nb):
    params = nbs.parameters_of(nb)
    assert params.get("profile") == "smoke", "the committed default must be the smoke profile (CI runs it as is)"
    meta = json.loads(nb.read_text())["metadata"]
    assert meta["kernelspec"]["name"] == runner.KERNEL_NAME
    student = json.loads(stu.student_path(nb).read_text())
    sources = "\n".join(c["source"] if isinstance(c["source"], str) else "".join(c["source"]) for c in student["cells"])
    assert "BEGIN SOLUTION" not in sources and "END SOLUTION" not in sources
    source = "\n".join(nbs._source(c) for c in json.loads(nb.read_text())["cells"])
    assert ("raise NotImplementedError" in sources) == stu.has_solutions(source)


@pytest.mark.parametrize("script", stu.source_scripts(), ids=lambda p: p.name)
def test_course_script_student_copy(script):
    student = stu.student_path(script)
    assert student.read_text() == stu.make_student_script(script), "stale student script: run `make student`"
    text = student.read_text()
    assert "BEGIN SOLUTION" not in text and "raise NotImplementedError" in text
    assert text.startswith("# Exercise version: generated from ../")


def test_load_exercises_from_a_script_defines_without_running_main(tmp_path):
    from dlo.course.checks import load_exercises

    script = tmp_path / "job.py"
    script.write_text("def f(x):\n    return 2 * x\n\nif __name__ == '__main__':\n    raise SystemExit('ran main')\n")
    ns = load_exercises(script)
    assert ns["f"](3) == 6 and ns["f"].__code__.co_filename == str(script.resolve())


def test_course_scripts_are_found():
    assert ROOT / "Jour2" / "ddp_train.py" in stu.source_scripts()


def test_strip_solutions_keeps_indentation_and_hint():
    src = "def f(x):\n    y = 1\n    # BEGIN SOLUTION: return twice x\n    return 2 * x\n    # END SOLUTION\n"
    out = stu.strip_solutions(src)
    assert out.splitlines() == ["def f(x):", "    y = 1", "    # TODO: return twice x",
                                "    raise NotImplementedError('return twice x')"]


def test_strip_solutions_without_hint():
    out = stu.strip_solutions("# BEGIN SOLUTION\nx = 1\n# END SOLUTION\nprint(x)")
    assert "raise NotImplementedError('write this part')" in out and out.endswith("print(x)")


@pytest.mark.parametrize("src, message", [
    ("# BEGIN SOLUTION\nx = 1\n", "never closed"),
    ("x = 1\n# END SOLUTION\n", "without a matching"),
    ("# BEGIN SOLUTION\n# BEGIN SOLUTION\n# END SOLUTION\n", "nested"),
])
def test_strip_solutions_rejects_bad_regions(src, message):
    with pytest.raises(ValueError, match=message):
        stu.strip_solutions(src)


def test_strip_outputs():
    nb = {"cells": [{"cell_type": "code", "outputs": [{"x": 1}], "execution_count": 3, "metadata": {"execution": {}},
                     "source": ""}], "metadata": {"papermill": {}}}
    clean = nbs.strip_outputs(nb)
    assert clean["cells"][0]["outputs"] == [] and clean["cells"][0]["execution_count"] is None
    assert "papermill" not in clean["metadata"] and nb["cells"][0]["outputs"]  # the input is untouched


def test_resolve_profile():
    assert nbs.resolve_profile("smoke") == "smoke" and nbs.resolve_profile("full") == "full"
    assert nbs.resolve_profile("auto") == "smoke"  # no GPU here
    with pytest.raises(ValueError, match="unknown profile 'fast'"):
        nbs.resolve_profile("fast")


@pytest.mark.parametrize("text, value", [("1", 1), ("0.5", 0.5), ("True", True), ("false", False), ("None", None),
                                          ("[1, 2]", [1, 2]), ("cuda", "cuda"), ("/data/x", "/data/x")])
def test_parse_value(text, value):
    assert nbs.parse_value(text) == value


def _dlo(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dlo", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def test_run_rejects_unknown_profile_in_one_line():
    res = _dlo("run", "Jour1/jour1.ipynb", "--profile", "fast")
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        "error: unknown profile 'fast': use 'smoke' (CPU, minutes, tiny data), 'full' (GPU node, real sizes) or 'auto'"]


def test_run_rejects_unknown_parameter_and_missing_notebook():
    res = _dlo("run", "Jour1/jour1.ipynb", "-p", "batchsize", "8")
    assert res.returncode == 1 and "has no parameter(s) batchsize" in res.stderr
    res = _dlo("run", "Jour1/nope.ipynb")
    assert res.returncode == 1 and "no notebook at" in res.stderr


@pytest.mark.notebook
def test_run_names_the_failing_cell(tmp_path):
    executed_dir = tmp_path / "out"
    with pytest.raises(nbs.NotebookError) as info:
        runner.run_notebook(FIXTURES / "failing.ipynb", profile="smoke", out_dir=executed_dir, log_output=False)
    msg = str(info.value)
    assert "\n" not in msg
    assert "failing.ipynb: code cell 2 (answer = 1 / zero) failed with ZeroDivisionError: division by zero" in msg
    assert (executed_dir / "failing.ipynb").is_file()


@pytest.mark.notebook
def test_run_executes_and_injects_parameters(tmp_path):
    out = runner.run_notebook(FIXTURES / "failing.ipynb", profile="smoke", parameters={"zero": 2},
                           out_dir=tmp_path, log_output=False)
    nb = json.loads(out.read_text())
    text = json.dumps(nb["cells"])
    assert "injected-parameters" in text and "0.5" in text


@pytest.mark.notebook
@pytest.mark.parametrize("param, value, expected", [
    ("batch_size", "0", "ValueError: batch_size must be a positive integer, got 0"),
    ("device", "cuda", "ValueError: device 'cuda' was requested but no GPU is visible"),
    ("data_dir", "/does/not/exist", "FileNotFoundError"),
])
def test_jour1_bad_input_gives_one_clear_line(tmp_path, param, value, expected):
    res = _dlo("run", "Jour1/jour1.ipynb", "--profile", "smoke", "--quiet", "--out-dir", str(tmp_path),
               "-p", param, value)
    assert res.returncode == 1
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("error: jour1.ipynb: code cell") and expected in last, last


def test_plain_engine_runs_code_cells_with_parameters_and_names_failures(capsys):
    ns = runner.run_plain(FIXTURES / "failing.ipynb", profile="smoke", parameters={"zero": 4})
    assert ns["answer"] == 0.25 and ns["profile"] == "smoke"
    assert "--- code cell 3/3: print(answer)" in capsys.readouterr().out
    with pytest.raises(nbs.NotebookError, match=r"failing.ipynb: code cell 2 \(answer = 1 / zero\) failed with "
                                                r"ZeroDivisionError: division by zero"):
        runner.run_plain(FIXTURES / "failing.ipynb", profile="smoke")
    with pytest.raises(nbs.NotebookError, match="has no parameter"):
        runner.run_plain(FIXTURES / "failing.ipynb", parameters={"nope": 1})


def test_plain_engine_works_without_ipython(tmp_path):
    """GPU nodes may have torch, pandas and tqdm but no IPython: display/Markdown are stood in for."""
    code = ("import sys; sys.modules['IPython'] = None\n"  # makes `import IPython` fail, as where it is absent
            "from dlo.course.runner import run_plain\n"
            f"ns = run_plain({str(FIXTURES / 'plain_display.ipynb')!r}, out_dir={str(tmp_path)!r})\n"
            "print('total', ns['total'], 'out_dir', ns['out_dir'])\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "**profile smoke**" in res.stdout
    assert "total 3 out_dir " + str(tmp_path) in res.stdout
    assert "a\n0  3" in res.stdout  # the Styler's DataFrame printed as text


def test_nbval_plugin_gives_late_outputs_a_minute():
    from dlo.course import nbval_plugin as _pytest_nbval

    class IPyNbCell:  # stands for nbval's item class, matched by name
        output_timeout = 5

    class Other:
        output_timeout = 5

    items = [IPyNbCell(), Other()]
    _pytest_nbval.pytest_collection_modifyitems(items)
    assert (items[0].output_timeout, items[1].output_timeout) == (60, 5)
