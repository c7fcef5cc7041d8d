"""`dlo report`: one static HTML page built from a runs folder and results/, read defensively.

A synthetic tree stands for what runs leave on disk: Jour 1 (its ladder) and shapes.ipynb run on this CPU under
runs/, and both recorded on an H100 in results/ (a notebook's results.json copied there, and a gpu-check file);
augment.ipynb's results.json cut short by a run that stopped while writing it; ddp.ipynb never run. The sentences
are written by the decision rule's own helpers (dlo.measure), so that the verdicts read from them are those the
notebooks print.
"""
from __future__ import annotations

import json
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from dlo.course import report
from dlo.course.report_html import esc, markdown_block, verdict
from dlo.measure import Measurement, compare_sentence
from dlo.runtime.paths import ROOT

EVIL = '<script>alert("x")</script>&'
NOTEBOOKS = ["Jour1/jour1.ipynb", "Jour1/shapes.ipynb", "Jour2/augment.ipynb", "Jour2/ddp.ipynb"]


def png(width: int = 4, height: int = 3) -> bytes:
    """A valid RGB PNG of one colour, written by hand (no imaging library)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    rows = b"".join(b"\x00" + b"\x20\x60\xc0" * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def steady(name: str, seconds: float, items: int = 256) -> Measurement:
    factors = (0.99, 1.0, 1.0, 1.01, 1.0, 0.99, 1.01, 1.0)
    return Measurement(name=name, times_s=[seconds * f for f in factors], items_per_call=items, steady=True,
                       min_repeats=8, max_repeats=8)


def conclusion(a: Measurement, b: Measurement) -> dict:
    return {"kind": "compare", "a": a.to_record(), "b": b.to_record(), "args": {},
            "sentence": compare_sentence(a, b), "rule": "rank test"}


def env(gpu: str | None) -> dict:
    if gpu:
        return {"date": "2026-12-01T10:00:00+00:00", "torch": "2.11.0+cu130", "device": "cuda", "cpu": "x86_64",
                "cpu_cores": 16, "gpu": gpu, "cuda": "13.0"}
    return {"date": "2026-12-01T09:00:00+00:00", "torch": "2.13.0+cpu", "device": "cpu", "cpu": "x86_64",
            "cpu_cores": 2, "gpu": None}


def jour1(gpu: str | None, base_s: float, best_s: float) -> dict:
    base, best = steady("fp32, batch 256", base_s), steady("bf16 + channels_last", best_s)
    row0 = {**base.to_record(), "step": "fp32", "applicable": True, "decision": "baseline", "batch_size": 256,
            "vs_best_text": "reference"}
    row1 = {**best.to_record(), "step": "bf16 autocast", "applicable": True, "decision": "kept", "batch_size": 256,
            "vs_best": base_s / best_s, "vs_best_text": f"{base_s / best_s:.1f}x"}
    row2 = {"step": "CUDA graphs", "applicable": False, "reason": "needs a CUDA GPU", "decision": "not applicable"}
    return {"env": env(gpu), "profile": "full" if gpu else "smoke", "ladder": [row0, row1, row2],
            "final_sentence": compare_sentence(best, base), "final_speedup": base_s / best_s,
            "conclusions": [conclusion(best, base)]}


@pytest.fixture
def tree(tmp_path):
    return make_tree(tmp_path)


def make_tree(tmp_path: Path) -> tuple[Path, Path]:
    """runs/ and results/ as described at the top (tests/test_browser.py opens their page in Chromium)."""
    runs, results = tmp_path / "runs", tmp_path / "results"
    (runs / "jour1").mkdir(parents=True)
    (runs / "jour1" / "results.json").write_text(json.dumps(jour1(None, 0.50, 0.25)))
    (runs / "jour1" / "ladder.png").write_bytes(png())
    (runs / "jour1" / "broken.png").write_bytes(b"not a png")
    shapes = {"env": env(None), "conclusions": [
        conclusion(steady(EVIL, 0.010), steady("Linear(513, 513)", 0.0102)),  # same within the noise
        conclusion(Measurement(name="Linear(512, 512)", times_s=[0.01] * 8, items_per_call=256, steady=False),
                   steady("Linear(513, 513)", 0.011)),  # its warm-up was not steady: no ratio
    ], "accumulation_sentence": f"A sentence about {EVIL}."}
    (runs / "shapes").mkdir()
    (runs / "shapes" / "results.json").write_text(json.dumps(shapes))
    (runs / "augment").mkdir()
    (runs / "augment" / "results.json").write_text(json.dumps(jour1(None, 0.5, 0.4))[:60])  # cut short
    results.mkdir()
    (results / "jour1-h100-2026-12-01.json").write_text(json.dumps(jour1("NVIDIA H100 80GB HBM3", 0.05, 0.008)))
    gpu_shapes = {"env": env("NVIDIA H100 80GB HBM3"), "conclusions": [
        conclusion(steady("Linear(512, 512)", 0.0010), steady("Linear(513, 513)", 0.0014))]}
    (results / "shapes-h100-2026-12-01.json").write_text(json.dumps(gpu_shapes))
    (results / "gpu-check-h100-2026-12-01.json").write_text(json.dumps({
        "environment": env("NVIDIA H100 80GB HBM3"), "dry_run": False, "results": [
            {"benchmark": "jour1_ladder", "what": "Jour 1 ladder", "target": ">= 5x", "value": 6.1, "verdict": "met"}]}))
    (results / "README.md").write_text("# not a reference\n")
    return runs, results


def build(tree, tmp_path) -> str:
    runs, results = tree
    return report.build_report([runs], results, tmp_path / "report.html", notebooks=NOTEBOOKS).read_text()


def test_the_page_puts_each_run_beside_the_recorded_gpu_run_and_the_references(tree, tmp_path):
    page = build(tree, tmp_path)
    # headlines with their spread and verdicts, on both devices
    for record in (steady("bf16 + channels_last", 0.25), steady("bf16 + channels_last", 0.008)):
        thr = f"{record.throughput:,.0f}"
        assert f"bf16 + channels_last: {thr} img/s [" in page
    assert "spread " in page and "[noise band]" in page
    for words in ("faster", "no measurable difference", "not steady", "kept", "baseline", "met"):
        assert f">{words}<" in page, words
    assert "CPU (x86_64, 2 cores)" in page and "NVIDIA H100 80GB HBM3" in page
    assert "recorded GPU run (results/)" in page and "gpu-check-h100-2026-12-01.json" in page
    # Jour 1's ladder: its rows, the step that does not apply and why
    assert "bf16 autocast" in page and "needs a CUDA GPU" in page and "Speed-up: 2x" in page
    # the figure embedded as a PNG, the file that is not one named in one line
    assert "data:image/png;base64," in page and "ladder.png" in page
    assert "broken.png: not a PNG image" in page
    # references: the section shapes.ipynb cites, labelled as a reference
    assert "Reference, published, not measured here: Peak throughput of accelerators" in page
    assert "H100 SXM" in page
    # nothing read from a file reaches the page unescaped
    assert EVIL not in page and "<script" not in page and esc(EVIL) in page


def test_a_cut_file_is_one_line_naming_it_and_a_notebook_not_run_says_so(tree, tmp_path):
    runs, _ = tree
    page = build(tree, tmp_path)
    cut = runs / "augment" / "results.json"
    lines = [ln for ln in page.splitlines() if str(cut) in ln and "not valid JSON" in ln]
    assert lines, "the cut results.json is not named"
    note = next(p for p in page.split('<p class="problem">')[1:] if p.startswith(esc(str(cut))))
    assert "\n" not in note.split("</p>")[0]
    ddp = page.split('id="nb-Jour2-ddp-ipynb"')[1].split("</section>")[0]
    assert "Not run yet" in ddp and "dlo run Jour2/ddp.ipynb" in ddp


@pytest.mark.parametrize("content", ["", "[1, 2]", '{"conclusions": 5, "ladder": [7], "env": "cpu"}',
                                     '{"conclusions": [{"a": 1, "b": null, "sentence": 3}], "ladder": [{}]}',
                                     "[" * 100_000, '{"x": NaN, "y": Infinity}'])
def test_whatever_a_results_json_holds_the_page_is_built(tmp_path, content):
    (tmp_path / "runs" / "jour1").mkdir(parents=True)
    (tmp_path / "runs" / "jour1" / "results.json").write_text(content)
    out = report.build_report([tmp_path / "runs"], tmp_path, tmp_path / "r.html", notebooks=["Jour1/jour1.ipynb"],
                              references=[])
    assert "Jour1/jour1.ipynb" in out.read_text()


def test_verdicts_are_read_from_the_decision_rules_own_sentences():
    fast, slow = steady("a", 0.010), steady("b", 0.020)
    assert verdict(compare_sentence(fast, slow))[0] == "faster"
    assert verdict(compare_sentence(slow, fast))[0] == "slower"
    assert verdict(compare_sentence(fast, steady("c", 0.0101)))[0] == "no measurable difference"
    unsteady = Measurement(name="u", times_s=[0.01] * 8, items_per_call=8, steady=False)
    assert verdict(compare_sentence(unsteady, fast))[0] == "not steady"


def test_references_markdown_is_escaped_before_its_marks_are_read():
    html = markdown_block(["| GPU | <b>x</b> |", "|---|---|", "| H100 | **989** |", "- `a<b>` and **bold**"])
    assert "<b>x</b>" not in html and "&lt;b&gt;x&lt;/b&gt;" in html
    assert "<strong>989</strong>" in html and "<code>a&lt;b&gt;</code>" in html


def test_the_cited_sections_and_benchmarks_exist():
    headings = [s.heading for s in report.read_references(ROOT / "REFERENCES.md")]
    for notebook, prefixes in report.CITED_SECTIONS.items():
        assert (ROOT / notebook).is_file(), notebook
        for p in prefixes:
            assert any(h.startswith(p) for h in headings), f"{notebook} cites {p!r}, not a heading of REFERENCES.md"
    from dlo.course.gpu_benchmarks import BENCHMARKS

    assert set(report.BENCHMARK_NOTEBOOKS) == {b.name for b in BENCHMARKS}
    assert all((ROOT / nb).is_file() for nb in report.BENCHMARK_NOTEBOOKS.values())


def test_the_course_as_it_is_builds(tmp_path):
    """Every course notebook, the real results/ and REFERENCES.md: every notebook has its section."""
    out = report.build_report([tmp_path], None, tmp_path / "report.html")
    page = out.read_text()
    for nb in report.source_notebooks():
        assert f">{nb.relative_to(ROOT).as_posix()}</h3>" in page


def test_dlo_report_prints_the_path_and_refuses_bad_options_in_one_line(tree, tmp_path):
    runs, results = tree
    out = tmp_path / "page.html"
    ok = subprocess.run([sys.executable, "-m", "dlo", "report", "--runs", str(runs), "--results", str(results),
                         "--out", str(out)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == str(out) and out.is_file()
    for bad in (["--runs", str(tmp_path / "nowhere")], ["--results", str(tmp_path / "nowhere")],
                ["--out", str(tmp_path)], ["--frobnicate"]):
        res = subprocess.run([sys.executable, "-m", "dlo", "report", *bad], capture_output=True, text=True,
                             timeout=120, cwd=ROOT)
        assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, (bad, res.stderr)
    helped = subprocess.run([sys.executable, "-m", "dlo", "report", "--help"], capture_output=True, text=True,
                            timeout=120, cwd=ROOT)
    assert all(o in helped.stdout for o in ("--runs", "--results", "--out"))


def test_dlo_report_needs_no_torch(tree, tmp_path):
    """The page is built from files: `dlo report` starts in a second, on a machine without torch too."""
    runs, results = tree
    code = (f"import sys; from dlo.cli import main; c = main(['report', '--runs', {str(runs)!r}, '--results', "
            f"{str(results)!r}, '--out', {str(tmp_path / 'r.html')!r}]); print(c, 'torch' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert res.stdout.split()[-2:] == ["0", "False"], (res.stdout, res.stderr)


def test_a_notebook_says_where_it_saved_and_how_to_see_every_result(tmp_path):
    from dlo.course.report import saved_line
    from dlo.runtime.paths import RUNS_DIR

    line = saved_line(RUNS_DIR / "jour1" / "results.json")
    assert line.splitlines()[0] == f"saved {RUNS_DIR / 'jour1' / 'results.json'}"
    assert "`dlo report`" in line and str(RUNS_DIR / "report.html") in line
    elsewhere = saved_line(tmp_path / "mine" / "jour1" / "results.json")
    assert f"`dlo report --runs {tmp_path / 'mine'}`" in elsewhere and str(tmp_path / "mine" / "report.html") in elsewhere


def test_every_notebook_ends_by_pointing_at_the_report():
    import json

    from dlo.course.notebooks import _source, source_notebooks

    for path in source_notebooks():
        cells = [_source(c) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
        assert any("saved_line(" in src for src in cells[-2:]), f"{path}: its results are saved without saved_line"
