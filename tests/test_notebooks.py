"""Notebooks: committed clean, student versions up to date, solution-region syntax, kernel guard, typed
parameters, the papermill runner (streamed output, kernel fallback, one-line errors)."""
from __future__ import annotations

import ast
import io
import json
import shutil
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import bare_node_env
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
    # The banner points to exercises only where there are some: in this notebook, or in a script it runs.
    # the first screen is the question: the title cell first, the banner right after it
    assert "".join(student["cells"][0]["source"]).startswith("# "), "the student copy does not open on its title"
    banner = student["cells"][1]["source"]
    scripts = [p.name for p in stu.source_scripts() if p.parent == nb.parent and p.name in source]
    if stu.has_solutions(source) or scripts:
        assert banner.startswith("> **Exercise version.**")
        assert all(f"`{name}`" in banner for name in scripts), banner
    else:
        assert "no exercise to write" in banner and ".py" not in banner, banner


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
        "error: unknown profile 'fast': use 'smoke' (CPU, minutes, tiny data), 'full' (GPU node, real sizes), 'dry' (the "
        "full profile's code paths on a CPU, scaled down) or 'auto'"]


def test_run_rejects_unknown_parameter_and_missing_notebook():
    res = _dlo("run", "Jour1/jour1.ipynb", "-p", "batchsize", "8")
    assert res.returncode == 2 and "has no parameter(s) batchsize" in res.stderr
    res = _dlo("run", "Jour1/nope.ipynb")
    assert res.returncode == 2 and "no notebook at" in res.stderr


def test_run_checks_parameter_types_before_starting_a_kernel(tmp_path):
    # a 'dlo' kernel spec found first on JUPYTER_PATH whose "kernel" only leaves a file behind: had the run
    # started a kernel before checking its parameters, the file would exist
    marker, spec = tmp_path / "kernel-started", tmp_path / "jupyter" / "kernels" / "dlo"
    spec.mkdir(parents=True)
    spec.joinpath("kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-c", f"import pathlib; pathlib.Path({str(marker)!r}).touch()", "{connection_file}"],
        "display_name": "recording kernel", "language": "python"}))
    res = subprocess.run([sys.executable, "-m", "dlo", "run", "Jour1/jour1.ipynb", "--profile", "smoke",
                          "-p", "batch_size", "sixteen"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "JUPYTER_PATH": str(tmp_path / "jupyter")})
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        "error: parameter batch_size of jour1.ipynb expects int or None, not 'sixteen' (str)"]
    assert res.stdout == "" and not marker.exists()  # no kernel was started


@pytest.mark.parametrize("out_dir", ["README.md", "/sys/dlo-test", "not-writable"])
def test_run_rejects_an_unusable_out_dir_in_one_line(out_dir, as_unprivileged, read_only_folder):
    if out_dir == "not-writable":  # as 'nobody' when the tests run as root (root writes into read-only folders)
        out_dir = str(read_only_folder[0] / "out")
        # 'nobody' reads the notebook from a folder it may enter, wherever the checkout lives (a clone in a folder
        # only root may enter, as `mktemp -d` makes, is not readable by it)
        notebook = shutil.copy(ROOT / "tests/fixtures/failing.ipynb", read_only_folder[1] / "failing.ipynb")
        # The forked child cannot read the interpreter's standard library as 'nobody': what the dry run imports
        # (torch, for the profile's device) must already be loaded here. `import dlo` no longer loads torch.
        import torch  # noqa: F401

        def in_process():  # the same checks (--dry-run) in this forked process: nobody may not run the venv python
            import contextlib
            import io

            from dlo.cli import main

            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                rc = main(["run", str(notebook), "--dry-run", "--out-dir", out_dir])
            return [rc, err.getvalue()]

        rc, err = as_unprivileged(in_process)
        res = subprocess.CompletedProcess([], rc, "", err)
    else:
        res = _dlo("run", "tests/fixtures/failing.ipynb", "--profile", "smoke", "--out-dir", out_dir)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "--out-dir" in lines[0], lines


def test_dry_run_checks_and_starts_nothing(tmp_path):
    res = _dlo("run", "tests/fixtures/failing.ipynb", "--profile", "smoke", "-p", "zero", "2", "--dry-run",
               "--out-dir", str(tmp_path / "out"))
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("ok: failing.ipynb would run with profile='smoke', zero=2")
    assert (tmp_path / "out").is_dir() and not (tmp_path / "out" / "failing.ipynb").exists()


def _params_nb(tmp_path: Path, source: str) -> Path:
    nb = {"cells": [{"cell_type": "code", "metadata": {"tags": ["parameters"]}, "source": source, "outputs": [],
                     "execution_count": None}], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "p.ipynb"
    path.write_text(json.dumps(nb))
    return path


def test_parameter_types_from_annotations_and_defaults(tmp_path):
    path = _params_nb(tmp_path, 'profile: str = "smoke"\nsize: int | None = None\nrate: float = 1\nflag = False\n'
                                'sizes: "list[int] | None" = None\nopt: Optional[str] = None\nfree = None\n')
    types = nbs.parameter_types(path)
    assert types == {"profile": (str,), "size": (int, type(None)), "rate": (float,), "flag": (bool,),
                     "sizes": (list, type(None)), "opt": (str, type(None)), "free": None}
    assert nbs.parameters_of(path)["size"] is None
    nbs.check_parameter_types(path, {"size": 16, "rate": 2, "sizes": [1, 2], "free": object(), "flag": True})
    for name, value, message in [("size", "sixteen", "size of p.ipynb expects int or None, not 'sixteen' (str)"),
                                 ("size", True, "expects int or None, not True (bool)"),
                                 ("flag", 1, "flag of p.ipynb expects bool, not 1 (int)"),
                                 ("profile", 3, "quote a text value")]:
        with pytest.raises(nbs.NotebookArgumentError, match=message.replace("(", r"\(").replace(")", r"\)")):
            nbs.check_parameter_types(path, {name: value})


@pytest.mark.parametrize("nb", nbs.source_notebooks(), ids=lambda p: p.stem)
def test_every_parameter_has_a_type(nb):
    untyped = [name for name, types in nbs.parameter_types(nb).items() if types is None]
    assert not untyped, f"annotate {untyped} in the parameters cell, e.g. batch_size: int | None = None"


@pytest.mark.parametrize("nb", nbs.source_notebooks(), ids=lambda p: p.stem)
def test_notebook_starts_with_the_kernel_guard(nb):
    code = [c for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "code"]
    assert nbs._source(code[0]).startswith(nbs.KERNEL_GUARD), \
        "the first code cell must start with dlo.course.notebooks.KERNEL_GUARD (the 'which kernel' message)"


def test_kernel_guard_says_which_kernel_in_one_line():
    """Where dlo cannot be imported (here: Python without its site-packages), the guard stops in one line."""
    res = subprocess.run([sys.executable, "-S", "-c", nbs.KERNEL_GUARD], cwd="/", capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 1
    assert res.stderr.strip().splitlines() == [
        "No module named 'dlo': select the kernel 'Python (dlo)' (Kernel > Change Kernel...); "
        "not in the list? see 'JupyterHub' in README.md"]
    assert "JupyterHub" in (ROOT / "README.md").read_text()


def test_kernel_guard_is_one_line_in_an_ipython_kernel_too():
    """In a plain "Python 3" kernel (IPython), a SystemExit would be shown between IPython's boilerplate ("An exception
    has occurred, use %tb to see the full traceback." and a UserWarning); the guard raises there an exception that
    IPython renders as its message alone."""
    pytest.importorskip("IPython")
    guard = nbs.KERNEL_GUARD.replace("import dlo\n", "import dlo_is_not_installed_here\n")
    code = ("from IPython.core.interactiveshell import InteractiveShell\n"
            f"InteractiveShell.instance().run_cell({guard!r})\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    shown = [line for line in (res.stdout + res.stderr).splitlines() if line.strip()]
    assert shown == ["No module named 'dlo_is_not_installed_here': select the kernel 'Python (dlo)' (Kernel > Change "
                     "Kernel...); not in the list? see 'JupyterHub' in README.md"], shown


def _echoing_record(tree: ast.Module) -> bool:
    last = tree.body[-1] if tree.body else None
    if not (isinstance(last, ast.Expr) and isinstance(last.value, ast.Call)):
        return False
    func = last.value.func
    return (func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")) == "record"


@pytest.mark.parametrize("nb", nbs.source_notebooks(), ids=lambda p: p.stem)
def test_no_cell_echoes_a_record(nb):
    """A cell ending in record(...) would show the returned dict (20 lines) under the cell: end it with ';'."""
    echoing = [i for i, c in enumerate((c for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "code"), 1)
               if _echoing_record(ast.parse(nbs._source(c))) and not nbs._source(c).rstrip().endswith(";")]
    assert not echoing, f"code cells {echoing} end with record(...): add ';'"


def test_line_filter_drops_noise_and_keeps_partial_lines():
    out = io.StringIO()
    stream = runner.LineFilter(out)
    stream.write("step 1\nUSDT:2026-01-01 1:1 x.cpp:52] profiler_start\nKeyboardInterrupt caught in kernel\nha")
    stream.write("lf\r 50%\r100%\n")
    stream.write("no newline")
    assert out.getvalue() == "step 1\nhalf\n100%\n"  # a redraw (\r) is a line; the next within 15 s is left out
    stream.flush()
    assert out.getvalue().endswith("100%\nno newline")


@pytest.mark.notebook
def test_run_streams_cells_and_their_output(tmp_path):
    res = _dlo("run", "tests/fixtures/streaming.ipynb", "--profile", "smoke", "--out-dir", str(tmp_path),
               "-p", "steps", "3")
    assert res.returncode == 0, res.stderr
    out = res.stdout.splitlines()
    heads = [line for line in out if line.startswith("--- code cell")]
    assert [h.split(" (")[0] for h in heads] == [f"--- code cell {n}/4" for n in (1, 2, 3, 4)]
    assert heads[1].endswith("s elapsed): import os") and heads[3].endswith("): for i in range(steps):")
    assert out[out.index(heads[1]) + 1] == "hello from cell 2"
    assert "**a Markdown display**" in out and "{'steps': 3, 'label': None}" in out
    assert out[-5:-2] == ["step 0 of 3", "step 1 of 3", "step 2 of 3"]
    assert out[-2].startswith("--- 4 code cells in ") and out[-1] == f"executed notebook: {tmp_path / 'streaming.ipynb'}"
    both = res.stdout + res.stderr
    assert "USDT:" not in both and "KeyboardInterrupt caught" not in both and "unknown parameter" not in both
    executed = (tmp_path / "streaming.ipynb").read_text()
    assert "USDT:2026" in executed  # left out of the log only: the executed notebook keeps every output
    quiet = _dlo("run", "tests/fixtures/streaming.ipynb", "--profile", "smoke", "--out-dir", str(tmp_path), "--quiet")
    assert quiet.returncode == 0 and quiet.stdout.splitlines() == [
        f"executed notebook: {tmp_path / 'streaming.ipynb'}"] and quiet.stderr == ""


def test_choose_kernel_falls_back_to_this_python(monkeypatch):
    nb = FIXTURES / "streaming.ipynb"
    monkeypatch.setattr(runner, "registered_kernels", lambda: {"dlo", "python3"})
    assert runner.choose_kernel(nb) == ("dlo", None)
    monkeypatch.setattr(runner, "registered_kernels", lambda: {"python3"})
    kernel, note = runner.choose_kernel(nb)
    assert kernel == runner.THIS_PYTHON_KERNEL and "\n" not in note
    assert note == (f"note: no Jupyter kernel named 'dlo' is registered here: running streaming.ipynb with this "
                    f"Python ({sys.executable}); to register it: "
                    f'{sys.executable} -m ipykernel install --user --name dlo --display-name "Python (dlo)" '
                    f'--env PATH "{Path(sys.executable).parent}:${{PATH}}"')


@pytest.mark.notebook
def test_run_without_a_registered_kernel_uses_this_python(tmp_path):
    """An environment built from environment.yml or a cluster module has no 'dlo' kernelspec: the run goes on."""
    nb = json.loads((FIXTURES / "streaming.ipynb").read_text())
    nb["metadata"]["kernelspec"]["name"] = "dlo-not-registered"
    path = tmp_path / "streaming.ipynb"
    path.write_text(json.dumps(nb))
    empty = tmp_path / "jupyter"
    empty.mkdir()
    env = {**os.environ, "JUPYTER_PATH": str(empty), "JUPYTER_DATA_DIR": str(empty)}
    res = subprocess.run([sys.executable, "-m", "dlo", "run", str(path), "--profile", "smoke", "--out-dir",
                          str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stderr
    notes = res.stderr.strip().splitlines()
    assert len(notes) == 1 and notes[0].startswith("note: no Jupyter kernel named 'dlo-not-registered' is registered")
    assert sys.executable in notes[0] and "hello from cell 2" in res.stdout


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
    assert res.returncode == 2  # refused by the notebook's own checks before any cell runs (dlo run -p)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: jour1.ipynb: code cell") and expected in lines[0], lines
    assert not (tmp_path / "jour1.ipynb").exists()


def test_plain_engine_runs_code_cells_with_parameters_and_names_failures(capsys):
    ns = runner.run_plain(FIXTURES / "failing.ipynb", profile="smoke", parameters={"zero": 4})
    assert ns["answer"] == 0.25 and ns["profile"] == "smoke"
    out = capsys.readouterr().out
    assert "--- code cell 3/3 (" in out and "s elapsed): print(answer)" in out
    with pytest.raises(nbs.NotebookError, match=r"failing.ipynb: code cell 2 \(answer = 1 / zero\) failed with "
                                                r"ZeroDivisionError: division by zero"):
        runner.run_plain(FIXTURES / "failing.ipynb", profile="smoke")
    with pytest.raises(nbs.NotebookError, match="has no parameter"):
        runner.run_plain(FIXTURES / "failing.ipynb", parameters={"nope": 1})


def test_plain_engine_works_without_ipython(tmp_path):
    """GPU nodes may have torch, pandas, matplotlib and tqdm but no IPython: displays come out as text, figures as
    files named by one line; no stand-in `IPython` module is left for pandas or matplotlib to read (one without
    `version_info` broke matplotlib's figure creation on such a node)."""
    code = ("from dlo.course.runner import run_plain\n"
            f"ns = run_plain({str(FIXTURES / 'plain_display.ipynb')!r}, out_dir={str(tmp_path)!r})\n"
            "print('total', ns['total'], 'out_dir', ns['out_dir'])\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env=bare_node_env())
    assert res.returncode == 0, res.stderr
    assert "**profile smoke**" in res.stdout
    assert "total 3 out_dir " + str(tmp_path) in res.stdout
    assert "a\n0  3" in res.stdout  # the Styler's DataFrame printed as text
    assert "IPython module: None" in res.stdout
    # the log's stand-in streams answer what code reads of sys.stdout (Ray reads its encoding)
    assert "stream encodings: utf-8 utf-8 " in res.stdout.lower(), res.stdout
    figures = sorted((tmp_path / "figures").glob("*.png"))
    assert [f.name for f in figures] == ["cell05-01.png", "cell05-02.png"], figures
    assert f"[figure: shown at plt.show -> {figures[0]}]" in res.stdout
    assert f"[figure: left open by the cell -> {figures[1]}]" in res.stdout
    assert res.stdout.index("shown at plt.show") < res.stdout.index("left open by the cell")
    assert figures[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_bare_node_python_cannot_import_the_jupyter_stack():
    """The environment the plain engine is tested in: torch, pandas and matplotlib import, the Jupyter stack
    does not (as on a GPU node), whatever this venv has installed."""
    probe = ("import importlib\n"
             "for name in ['IPython', 'IPython.display', 'ipykernel', 'nbformat', 'papermill', 'jupyter_client',\n"
             "             'nbclient', 'torch', 'pandas', 'matplotlib.pyplot', 'tqdm.auto']:\n"
             "    try:\n"
             "        importlib.import_module(name); print(name, 'ok')\n"
             "    except ModuleNotFoundError:\n"
             "        print(name, 'missing')\n")
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                         env=bare_node_env())
    seen = dict(line.split() for line in res.stdout.splitlines())
    assert seen == {"IPython": "missing", "IPython.display": "missing", "ipykernel": "missing", "nbformat": "missing",
                    "papermill": "missing", "jupyter_client": "missing", "nbclient": "missing", "torch": "ok",
                    "pandas": "ok", "matplotlib.pyplot": "ok", "tqdm.auto": "ok"}, res.stdout + res.stderr


def test_nbval_plugin_gives_late_outputs_a_minute():
    from dlo.course import nbval_plugin as _pytest_nbval

    class IPyNbCell:  # stands for nbval's item class, matched by name
        output_timeout = 5
        nodeid = "Jour1/shapes.ipynb::Cell 0"

    class Other:
        output_timeout = 5
        nodeid = "tests/test_x.py::test_y"

    items = [IPyNbCell(), Other()]
    _pytest_nbval.pytest_collection_modifyitems(items)
    assert (items[0].output_timeout, items[1].output_timeout) == (60, 5)


@pytest.mark.parametrize("nb", nbs.source_notebooks(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_cell_has_a_unique_id(nb):
    """nbformat 4.5: a cell without an id is a warning today and an error in future nbformat versions; nbval also
    warns on duplicated ids."""
    ids = [c.get("id") for c in json.loads(nb.read_text())["cells"]]
    assert None not in ids and len(ids) == len(set(ids)), nb
