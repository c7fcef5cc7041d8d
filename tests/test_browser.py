"""A student's session, in a real browser: JupyterLab in headless Chromium opens a student notebook, runs it to
its first check cell, reads the NOT YET message, types the solution, reruns and reads PASSED; on the way the
tqdm bar must be drawn as a widget and a matplotlib figure must render. Screenshots go to runs/browser/.

Not part of `make test` (CI has no browser): `make test-browser` runs it (it installs the playwright package
into .venv; Chromium comes from the system, e.g. Debian's `apt-get install chromium`, or DLO_CHROMIUM=/path).
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from dlo.course.notebooks import _source
from dlo.runtime.context import free_port
from dlo.runtime.paths import ROOT

if not os.environ.get("DLO_BROWSER_TEST"):
    pytest.skip("browser test: run it with `make test-browser`", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is missing: make test-browser installs it")
CHROMIUM = os.environ.get("DLO_CHROMIUM") or next(
    (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
if CHROMIUM is None:
    pytest.skip("no Chromium found (Debian: apt-get install chromium; or set DLO_CHROMIUM)", allow_module_level=True)

NOTEBOOK = Path("Jour4") / "student" / "hpo.ipynb"  # tqdm widget, figures, then its first exercise and check
SOURCE = Path("Jour4") / "hpo.ipynb"
SHOTS = ROOT / "runs" / "browser"
SLOW_MS = 900_000  # a busy 2-core machine: kernel start, Optuna studies, figures


def _landmarks() -> dict[str, int]:
    """Indexes (among all cells, as JupyterLab shows them) of the first TODO cell, its check cell, and the first
    tqdm and figure cells before the check."""
    cells = json.loads((ROOT / NOTEBOOK).read_text())["cells"]
    src = [_source(c) if c["cell_type"] == "code" else None for c in cells]
    todo = next(i for i, s in enumerate(src) if s and "raise NotImplementedError" in s)
    check = next(i for i, s in enumerate(src) if s and i > todo and "check(" in s)
    tqdm = next(i for i, s in enumerate(src[:check]) if s and "tqdm(" in s)
    figure = next(i for i, s in enumerate(src[:check]) if s and "plt.show()" in s)
    return {"todo": todo, "check": check, "tqdm": tqdm, "figure": figure}


def _solution(index_in_student: int) -> str:
    """The source notebook's version of the student's TODO cell, without the solution markers."""
    student = json.loads((ROOT / NOTEBOOK).read_text())["cells"][index_in_student]
    source = next(c for c in json.loads((ROOT / SOURCE).read_text())["cells"] if c.get("id") == student.get("id"))
    return "\n".join(line for line in _source(source).splitlines() if not re.match(r"\s*# (BEGIN|END) SOLUTION", line))


@pytest.fixture
def lab(tmp_path):
    """JupyterLab on 127.0.0.1 with a token, serving a copy of the student notebook (the checkout stays clean)."""
    work = tmp_path / "work"
    (work / NOTEBOOK.parent).mkdir(parents=True)
    shutil.copy(ROOT / NOTEBOOK, work / NOTEBOOK)
    port, token = free_port(), secrets.token_hex(16)
    news = tmp_path / "settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    news.parent.mkdir(parents=True)
    news.write_text('{"fetchNews": "false"}')  # no "official Jupyter news?" toast over the screenshots
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path / "config"), "JUPYTER_RUNTIME_DIR": str(tmp_path / "rt"),
           "JUPYTER_DATA_DIR": str(tmp_path / "data"), "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "workspaces"), "DLO_RUNS_DIR": str(tmp_path / "runs")}
    log = open(tmp_path / "jupyterlab.log", "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={work}", "--LabApp.expose_app_in_browser=True",
         "--ServerApp.port_retries=0", "--LabApp.extension_manager=readonly",
         *(["--allow-root"] if os.geteuid() == 0 else [])], env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while True:
        try:
            urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=5)
            break
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                pytest.fail(f"JupyterLab did not start: {(tmp_path / 'jupyterlab.log').read_text()[-2000:]}")
            time.sleep(1)
    try:
        yield url, token
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def test_student_notebook_in_a_browser(lab):
    url, token = lab
    marks = _landmarks()
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(SLOW_MS)
        page.goto(f"{url}/lab/tree/{NOTEBOOK.as_posix()}?token={token}")
        cells = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell")
        cells.nth(marks["check"]).wait_for()
        kernel_idle = ("() => { const w = window.jupyterapp.shell.currentWidget;"
                       " const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;"
                       " return k && k.status === 'idle'; }")
        page.wait_for_function(kernel_idle)
        name = page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.name")
        assert name == "dlo", f"the notebook opened with kernel {name!r}, not 'dlo'"
        page.screenshot(path=str(SHOTS / "01-opened.png"))

        # everything above the check cell, as a student would with Run > Run All Above Selected Cell
        cells.nth(marks["check"]).locator(".jp-InputPrompt").click()
        page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-above')")
        done_above = ("(n) => { const w = window.jupyterapp.shell.currentWidget; const cells = w.content.widgets;"
                      " const code = cells.slice(0, n).filter(c => c.model.type === 'code');"
                      " const failed = code.some(c => c.model.sharedModel.outputs.some(o => o.output_type === 'error'));"
                      " return failed || (code.every(c => c.model.executionCount !== null)"
                      "   && w.sessionContext.session.kernel.status === 'idle'); }")
        page.wait_for_function(done_above, arg=marks["check"])
        errors = page.evaluate(
            "(n) => window.jupyterapp.shell.currentWidget.content.widgets.slice(0, n)"
            ".flatMap(c => c.model.type === 'code' ? c.model.sharedModel.outputs : [])"
            ".filter(o => o.output_type === 'error').map(o => o.ename + ': ' + o.evalue)", marks["check"])
        assert not errors, f"cells above the first check failed: {errors}"

        check = cells.nth(marks["check"])
        check.locator(".jp-InputArea-editor").click()
        page.keyboard.press("Shift+Enter")
        check.locator(".jp-OutputArea-output").filter(has_text="NOT YET").wait_for()
        not_yet = check.locator(".jp-OutputArea-output").inner_text()
        assert "NOT YET hpo/" in not_yet and "not implemented yet" in not_yet, not_yet
        assert "Traceback" not in not_yet  # one line, no traceback
        check.scroll_into_view_if_needed()
        page.screenshot(path=str(SHOTS / "02-not-yet.png"))

        # the student types the solution into the TODO cell and runs it, then the check again
        todo = cells.nth(marks["todo"])
        todo.locator(".cm-content").click()
        page.keyboard.press("Control+A")
        page.keyboard.insert_text(_solution(marks["todo"]))
        page.keyboard.press("Shift+Enter")
        page.wait_for_function(kernel_idle)
        check.locator(".jp-InputArea-editor").click()
        page.keyboard.press("Shift+Enter")
        check.locator(".jp-OutputArea-output").filter(has_text="PASSED").wait_for()
        passed = check.locator(".jp-OutputArea-output").inner_text()
        assert passed.startswith("PASSED hpo/"), passed
        check.scroll_into_view_if_needed()
        page.screenshot(path=str(SHOTS / "03-passed.png"))

        # tqdm drew a progress-bar widget (ipywidgets), not a text bar, and it reached its end
        cells.nth(marks["tqdm"]).scroll_into_view_if_needed()
        bar = cells.nth(marks["tqdm"]).locator(".widget-hprogress")
        assert bar.count() >= 1, "tqdm drew no widget: is ipywidgets' JupyterLab extension installed?"
        label = cells.nth(marks["tqdm"]).locator(".jupyter-widgets.widget-hbox").first.text_content()
        m = re.search(r"(\d+)/(\d+)", label or "")
        assert m and m.group(1) == m.group(2), f"tqdm bar not complete: {label!r}"
        page.screenshot(path=str(SHOTS / "04-tqdm-widget.png"))

        # the figure is a rendered image, not "<Figure size ...>"
        cells.nth(marks["figure"]).scroll_into_view_if_needed()
        img = cells.nth(marks["figure"]).locator(".jp-OutputArea-output img").first
        img.wait_for()
        assert img.evaluate("(el) => el.complete && el.naturalWidth") > 100
        page.screenshot(path=str(SHOTS / "05-figure.png"))
        browser.close()


def test_the_report_page_in_a_browser(tmp_path):
    """`dlo report`'s page, opened from the disk (file://, no server): its headings, a run beside the recorded GPU
    run and the reference, and an embedded figure that the browser decodes. Screenshot: runs/browser/report.png."""
    import test_report as synthetic  # the synthetic runs/ and results/ of tests/test_report.py

    runs, results = synthetic.make_tree(tmp_path)
    from dlo.course.report import build_report

    page_file = build_report([runs], results, tmp_path / "report.html", notebooks=synthetic.NOTEBOOKS)
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000}, java_script_enabled=False)
        page.goto(page_file.as_uri())
        assert page.locator("h1").inner_text().startswith("Deep Learning Optimisé")
        assert page.locator("h2").all_inner_texts()[:3] == ["Notebooks", "Day 1", "Day 2"]
        in_plan_order = ["Jour1/jour1.ipynb", "Jour1/shapes.ipynb", "Jour2/ddp.ipynb", "Jour2/augment.ipynb"]
        assert page.locator("section.notebook h3").all_inner_texts() == in_plan_order
        jour1 = page.locator("#nb-Jour1-jour1-ipynb")
        devices = jour1.locator("article .device").all_inner_texts()
        assert devices[0] == "CPU (x86_64, 2 cores)" and "NVIDIA H100 80GB HBM3" in devices[1], devices
        assert any(d.startswith("reference Reference, published, not measured here") for d in devices), devices
        img = jour1.locator("figure img").first
        img.scroll_into_view_if_needed()
        size = img.evaluate("(el) => [el.complete, el.naturalWidth, el.naturalHeight]")
        assert size == [True, 4, 3], size
        problem = page.locator("#nb-Jour2-augment-ipynb .problem")
        assert "not valid JSON" in problem.inner_text() and problem.inner_text().count("\n") == 0
        jour1.evaluate("(el) => el.scrollIntoView()")  # the top of Jour 1's section: its runs side by side
        page.screenshot(path=str(SHOTS / "report.png"))
        page.screenshot(path=str(SHOTS / "report-full.png"), full_page=True)
        browser.close()
