"""``dlo report``: one static HTML page of every notebook's results, built from what the runs left on disk.

Per notebook of the course, in the plan's order (:mod:`dlo.course.plan`, day by day), every run found, side by side:

- the runs under ``runs/`` (``dlo run``, ``make test``'s notebook stage) and under any other folder given with
  ``--runs``: ``<folder>/<notebook>/results.json`` and the figures next to it;
- the recorded GPU runs of ``results/``: a notebook's results.json committed as ``<notebook>-<gpu>-<date>.json``,
  and the rows of ``dlo gpu-check``'s files (``gpu-check-*.json``) that belong to the notebook;

each with the device and environment it ran on (the ``env`` block every results.json carries), its headline numbers
(the sentences recorded by :func:`dlo.measure.conclude` with the medians and noise band behind them, Jour 1's
ladder rows) with their spread and verdicts, and its figures; then the published figures of ``REFERENCES.md`` that
the notebook cites, labelled as references, so that a run can be read next to them.

Nothing read is trusted: every value taken from a file is escaped (:mod:`dlo.course.report_html`), no file's
content is executed, and a file that cannot be read (cut short, not JSON, not of the expected shape) is one line in
the page naming it. The page needs no server and no JavaScript; figures are embedded as PNG ``data:`` URLs, so
that the one file can be sent or archived.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from dlo.course import plan
from dlo.course.notebooks import source_notebooks
from dlo.course.report_html import one_line, render
from dlo.runtime.atomic import atomic_write_text
from dlo.runtime.paths import ROOT, RUNS_DIR, probe_writable

#: The sections of REFERENCES.md each notebook cites (a heading's first words), besides the sections that name the
#: notebook's path themselves; held to REFERENCES.md's headings by tests/test_report.py.
CITED_SECTIONS: dict[str, tuple[str, ...]] = {
    "Jour1/jour1.ipynb": ("ImageNet ResNet-152 on one A100", "CIFAR-10 speed records"),
    "Jour1/shapes.ipynb": ("Peak throughput of accelerators",),
    "Jour2/ddp.ipynb": ("ImageNet ResNet-152 on one A100",),
    "Jour2/dp_scratch.ipynb": ("ImageNet ResNet-152 on one A100",),
    "Jour3/recipes.ipynb": ("CIFAR-10 speed records",),
    "Jour4/llm_memory.ipynb": ("LLM training throughput", "Model sizes", "Peak throughput of accelerators"),
    "tp_fsdp/fsdp.ipynb": ("LLM training throughput",),
    "Jour4/cifar_race.ipynb": ("CIFAR-10 speed records",),
}

#: The notebook each benchmark of ``dlo gpu-check`` measures (dlo.course.gpu_benchmarks.BENCHMARKS), so that a
#: recorded gpu-check row is shown beside that notebook's runs; held to the benchmarks by tests/test_report.py.
BENCHMARK_NOTEBOOKS: dict[str, str] = {
    "jour1_ladder": "Jour1/jour1.ipynb", "mixcutmix": "Jour2/augment.ipynb", "fsdp_mfu": "tp_fsdp/fsdp.ipynb",
    "pipeline_1f1b": "tp_pipeline/pipeline.ipynb", "tp_vs_dtensor": "tp_tensor_parallel/tensor_parallel.ipynb",
    "grid_3d": "tp_pipeline/grid.ipynb", "race": "Jour4/cifar_race.ipynb",
}

#: A figure larger than this is linked (relative to the page) rather than embedded.
EMBED_MAX_BYTES = 8 * 2**20
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@dataclass
class Figure:
    path: Path
    data: bytes | None = None  # the PNG's bytes when embedded; None: linked
    problem: str | None = None


@dataclass
class Run:
    """One results.json of a notebook: a run under a runs folder, or a recorded one in results/."""

    path: Path
    origin: str  # "run" (a runs folder) or "recorded" (results/)
    results: dict[str, Any] | None = None
    problem: str | None = None  # one line naming the file when it cannot be read
    figures: list[Figure] = field(default_factory=list)


@dataclass
class CheckRow:
    """One row of a recorded ``dlo gpu-check`` file that belongs to a notebook."""

    path: Path
    environment: dict[str, Any]
    row: dict[str, Any]
    quick: bool


@dataclass
class Reference:
    heading: str
    lines: list[str]
    source: Path


@dataclass
class NotebookReport:
    notebook: str  # relative to the project root, e.g. Jour1/shapes.ipynb
    entry: plan.Entry | None
    runs: list[Run] = field(default_factory=list)
    checks: list[CheckRow] = field(default_factory=list)
    references: list[Reference] = field(default_factory=list)
    looked_in: list[Path] = field(default_factory=list)  # where its results.json would be

    @property
    def stem(self) -> str:
        return Path(self.notebook).stem


# --------------------------------------------------------------------------------------------------
# Reading files: every failure is one line naming the file
# --------------------------------------------------------------------------------------------------

def read_results(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """``(results, None)`` or ``(None, the one line that says why it cannot be shown)``."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return None, f"{path}: not UTF-8 text, so not a results.json"
    except OSError as exc:
        return None, f"{path}: cannot be read ({one_line(exc.strerror or exc)})"
    if not text.strip():
        return None, f"{path}: empty (a run stopped before writing it?)"
    try:
        data = json.loads(text)
    except RecursionError:
        return None, f"{path}: nested too deeply to be a results.json"
    except ValueError as exc:
        return None, f"{path}: not valid JSON ({one_line(exc)}; cut short by a run that stopped while writing it?)"
    if not isinstance(data, dict):
        return None, f"{path}: a JSON {type(data).__name__}, not the object a results.json holds"
    return data, None


def read_figures(folder: Path) -> list[Figure]:
    """The PNG figures a run left in ``folder``, embedded (or linked when large); a file that is not a PNG is
    one line."""
    figures = []
    try:
        paths = sorted(p for p in folder.glob("*.png") if p.is_file())
    except OSError:
        return []
    for p in paths:
        try:
            size = p.stat().st_size
            if size > EMBED_MAX_BYTES:
                figures.append(Figure(p))
                continue
            data = p.read_bytes()
        except OSError as exc:
            figures.append(Figure(p, problem=f"{p}: cannot be read ({one_line(exc.strerror or exc)})"))
            continue
        if not data.startswith(PNG_MAGIC):
            figures.append(Figure(p, problem=f"{p}: not a PNG image (cut short?)"))
            continue
        figures.append(Figure(p, data=data))
    return figures


def read_run(path: Path, origin: str, *, with_figures: bool) -> Run:
    results, problem = read_results(path)
    run = Run(path, origin, results, problem)
    if with_figures:
        run.figures = read_figures(path.parent)
    return run


# --------------------------------------------------------------------------------------------------
# REFERENCES.md: sections, and which notebook cites which
# --------------------------------------------------------------------------------------------------

def read_references(path: Path) -> list[Reference]:
    """The ``## `` sections of a markdown file of references (none if it is missing or unreadable)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return []
    sections: list[Reference] = []
    for line in text.splitlines():
        if line.startswith("## "):
            sections.append(Reference(line[3:].strip(), [], path))
        elif sections:
            sections[-1].lines.append(line)
    for s in sections:
        while s.lines and not s.lines[-1].strip():
            s.lines.pop()
    return sections


def cited(notebook: str, sections: Sequence[Reference]) -> list[Reference]:
    """The sections ``notebook`` cites: those :data:`CITED_SECTIONS` lists for it, and those naming its path."""
    prefixes = CITED_SECTIONS.get(notebook, ())
    out = []
    for s in sections:
        names_it = notebook in s.heading or any(notebook in line for line in s.lines)
        if names_it or any(s.heading.startswith(p) for p in prefixes):
            out.append(s)
    return out


# --------------------------------------------------------------------------------------------------
# results/: recorded notebook runs and gpu-check files
# --------------------------------------------------------------------------------------------------

def _recorded_owner(path: Path, stems: dict[str, str]) -> str | None:
    """The notebook a file ``<notebook>-<gpu>-<date>.json`` of results/ belongs to (the longest stem that fits)."""
    fits = [stem for stem in stems if path.stem.startswith(stem + "-")]
    return stems[max(fits, key=len)] if fits else None


def read_recorded(folder: Path, reports: dict[str, NotebookReport]) -> list[str]:
    """Put results/'s files beside their notebooks; returns the one-line problems of files that belong to none."""
    stems = {r.stem: r.notebook for r in reports.values()}
    problems = []
    try:
        files = sorted(p for p in folder.glob("*.json") if p.is_file())
    except OSError:
        return [f"{folder}: cannot be listed"]
    for path in files:
        owner = _recorded_owner(path, stems)
        data, problem = read_results(path)
        if data is not None and isinstance(data.get("results"), list) and path.stem.startswith("gpu-check"):
            problems += _gpu_check_rows(path, data, reports)
        elif owner is not None:
            reports[owner].runs.append(Run(path, "recorded", data, problem))
        elif problem:
            problems.append(problem)
        else:
            problems.append(f"{path}: belongs to no notebook (name it <notebook>-<gpu>-<date>.json, see "
                            f"results/README.md)")
    return problems


def _gpu_check_rows(path: Path, data: dict[str, Any], reports: dict[str, NotebookReport]) -> list[str]:
    env = data.get("environment") if isinstance(data.get("environment"), dict) else {}
    problems = []
    for row in data["results"]:
        if not isinstance(row, dict):
            problems.append(f"{path}: a row that is not an object ({one_line(repr(row))[:80]})")
            continue
        notebook = row.get("notebook") if isinstance(row.get("notebook"), str) else \
            BENCHMARK_NOTEBOOKS.get(str(row.get("benchmark")))
        if notebook in reports:
            reports[notebook].checks.append(CheckRow(path, env, row, quick="notebook" in row))
    return problems


# --------------------------------------------------------------------------------------------------
# The page
# --------------------------------------------------------------------------------------------------

def collect(runs: Sequence[Path], results: Path | None, notebooks: Sequence[str],
            references: Sequence[Path]) -> tuple[list[NotebookReport], list[str]]:
    """Every notebook's runs, recorded runs and cited references, in the plan's order; and the one-line problems
    of files that belong to no notebook."""
    order = {e.notebook: i for i, e in enumerate(plan.PLAN)}
    entries = {e.notebook: e for e in plan.PLAN}
    names = sorted(notebooks, key=lambda nb: (order.get(nb, len(order)), nb))
    reports = {nb: NotebookReport(nb, entries.get(nb)) for nb in names}
    sections = [s for ref in references for s in read_references(ref)]
    for report in reports.values():
        for folder in runs:
            path = folder / report.stem / "results.json"
            report.looked_in.append(path)
            if path.exists() or path.is_symlink():
                report.runs.append(read_run(path, "run", with_figures=True))
        report.references = cited(report.notebook, sections)
    problems = read_recorded(results, reports) if results is not None and results.is_dir() else []
    return list(reports.values()), problems


def _check_out(out: Path) -> Path:
    if out.is_dir():
        raise ValueError(f"--out {out} is a folder: give a file name, e.g. {out / 'report.html'}")
    try:
        probe_writable(out.parent)
    except OSError as exc:
        raise ValueError(f"--out {out}: its folder cannot be written ({one_line(exc.strerror or exc)})") from None
    return out


def resolve_options(runs: Sequence[str | os.PathLike] | None, results: str | os.PathLike | None,
                    out: str | os.PathLike | None) -> tuple[list[Path], Path | None, Path]:
    """The folders to read and the page to write; a missing folder given by hand is a ValueError (one line)."""
    folders = [Path(r) for r in runs] if runs else [RUNS_DIR]
    for f in folders if runs else []:
        if not f.is_dir():
            raise ValueError(f"--runs {f}: no such folder (give folders holding <notebook>/results.json)")
    if results is not None and not Path(results).is_dir():
        raise ValueError(f"--results {results}: no such folder (the recorded GPU runs, e.g. results/)")
    recorded = Path(results) if results is not None else ROOT / "results"
    page = _check_out(Path(out) if out is not None else folders[0] / "report.html")
    return folders, recorded, page


def build_report(runs: Sequence[str | os.PathLike] | None = None, results: str | os.PathLike | None = None,
                 out: str | os.PathLike | None = None, *, notebooks: Sequence[str] | None = None,
                 references: Sequence[str | os.PathLike] | None = None) -> Path:
    """Write the page and return its path. ``runs``: folders of ``<notebook>/results.json`` (default runs/, or
    $DLO_RUNS_DIR); ``results``: the recorded GPU runs (default results/); ``out``: the page (default
    ``<first runs folder>/report.html``); ``notebooks``: paths relative to the project root (default every course
    notebook); ``references``: markdown files of published figures (default REFERENCES.md, and any other
    ``*.md`` of the results folder but its README)."""
    folders, recorded, page = resolve_options(runs, results, out)
    if notebooks is None:
        notebooks = [p.relative_to(ROOT).as_posix() for p in source_notebooks()]
    if references is None:
        extra = sorted(p for p in recorded.glob("*.md") if p.name.lower() != "readme.md") if recorded.is_dir() else []
        references = [ROOT / "REFERENCES.md", *extra]
    reports, problems = collect(folders, recorded, notebooks, [Path(r) for r in references])
    html = render(reports, problems, sources=[*folders, recorded], page=page)
    return atomic_write_text(page, html)


__all__ = ["build_report", "collect", "read_results", "read_references", "cited", "CITED_SECTIONS",
           "BENCHMARK_NOTEBOOKS", "resolve_options", "Run", "NotebookReport", "Reference", "CheckRow", "Figure",
           "one_line"]


def saved_line(results_json: str | os.PathLike) -> str:
    """What a notebook prints when it has saved its results: the file, and how to see it beside the other runs and
    the references (``dlo report``, with ``--runs`` when the run went to another folder than runs/)."""
    path = Path(results_json)
    runs = path.parent.parent
    same = runs.resolve() == RUNS_DIR.resolve()
    command = "dlo report" if same else f"dlo report --runs {runs}"
    return (f"saved {path}\nOne page of every result, beside the references and the recorded GPU runs: "
            f"`{command}` (writes {runs / 'report.html'})")
