"""`dlo run --dry-run` refuses what the real run would refuse, in one line and with exit code 2, by running the
notebook's own checks: its code cells up to the last one tagged `validate` (set-up, parameters, settings), in
another Python, with none of the work that follows them."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dlo.course import notebooks as nbs
from dlo.course import runner
from dlo.course import student as stu
from dlo.runtime.paths import ROOT

FIXTURES = Path(__file__).parent / "fixtures"


def _dry_run(notebook: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dlo", "run", notebook, "--dry-run", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, env={**os.environ, **(env or {})})


def _code_cells(nb: Path) -> list[dict]:
    return [c for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "code"]


@pytest.mark.parametrize("nb", nbs.source_notebooks(), ids=lambda p: p.stem)
def test_every_notebook_tags_its_validation_cells(nb):
    """The settings cell (the one after `parameters`) is tagged `validate`, and no cell up to the last tagged one is
    an exercise, a check or the work: the dry run runs exactly the set-up, parameters and settings cells."""
    cells = _code_cells(nb)
    upto = runner.validation_cells(nb)
    assert upto >= 3, f"{nb.name}: tag its settings cell (PROFILES, profile_settings, checks) `validate`"
    tags = [c.get("metadata", {}).get("tags", []) for c in cells[:upto]]
    assert "setup" in tags[0] and "parameters" in tags[1] and runner.VALIDATE_TAG in tags[-1], tags
    for cell in cells[:upto]:
        source = nbs._source(cell)
        assert "exercise" not in cell.get("metadata", {}).get("tags", []) and "check(" not in source \
            and "launch(" not in source, f"{nb.name}: a validation cell must not do the work: {source[:80]!r}"
    assert runner.validation_cells(stu.student_path(nb)) == upto, "regenerate the student copies: make student"


def test_a_dry_run_runs_the_validation_cells_and_nothing_after(tmp_path):
    ok = _dry_run(str(FIXTURES / "validated.ipynb"), "--profile", "smoke", "-p", "size", "3", "--out-dir", str(tmp_path))
    assert ok.returncode == 0 and ok.stdout.startswith("ok: validated.ipynb would run with"), ok.stderr
    bad = _dry_run(str(FIXTURES / "validated.ipynb"), "--profile", "smoke", "-p", "size", "0", "--out-dir", str(tmp_path))
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.splitlines() == ["error: validated.ipynb: code cell 2 (if not isinstance(size, int) or size < 1:) "
                                       "failed with ValueError: size must be a positive integer, got 0"]
    assert not (tmp_path / "work-started").exists()  # the cell after the validation cells never ran
    assert runner.validation_cells(FIXTURES / "failing.ipynb") == 0  # nothing tagged: nothing run


BAD = [  # (notebook, arguments, environment, what the notebook says)
    ("Jour1/jour1.ipynb", ["-p", "batch_size", "-5"], {}, "ValueError: batch_size must be a positive integer, got -5"),
    ("Jour1/jour1.ipynb", ["-p", "batch_size", "0"], {}, "ValueError: batch_size must be a positive integer, got 0"),
    ("Jour1/jour1.ipynb", ["-p", "repeats", "2"], {}, "ValueError: repeats must be an integer >= 3"),
    ("Jour1/jour1.ipynb", ["-p", "sweep", "[1024, 0]"], {}, "ValueError: sweep must be a non-empty list of positive"),
    ("Jour2/augment.ipynb", ["-p", "device", "gpu"], {}, "ValueError: unknown device 'gpu'"),
    ("Jour2/augment.ipynb", ["-p", "data_dir", "/does/not/exist"], {},
     "FileNotFoundError: data_dir /does/not/exist does not exist"),
    ("Jour3/optimizers.ipynb", [], {"DLO_DATA_DIR": "/does/not/exist"},
     "FileNotFoundError: DLO_DATA_DIR /does/not/exist does not exist"),
    ("Jour3/optimizers.ipynb", ["-p", "epochs", "0"], {}, "ValueError: epochs must be a positive integer, got 0"),
    ("Jour2/dp_scratch.ipynb", ["-p", "nprocs", "[0]"], {},
     "ValueError: data parallelism needs at least 2 process(es) per run, got [0]"),
    ("Jour2/ddp.ipynb", ["-p", "nproc", "-2"], {}, "ValueError: DDP needs at least 2 process(es) per run, got -2"),
    ("tp_fsdp/experts.ipynb", ["-p", "nproc", "4"], {}, "ValueError: nproc must be at least 2 and divide the 6 experts, "
                                                       "got 4"),
]


@pytest.mark.parametrize("notebook, args, env, expected", BAD, ids=lambda v: v if isinstance(v, str) else None)
def test_dry_run_refuses_what_the_run_would_refuse_in_one_line(tmp_path, notebook, args, env, expected):
    res = _dry_run(notebook, "--profile", "smoke", "--out-dir", str(tmp_path), *args, env=env)
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {Path(notebook).name}: code cell 3 (") \
        and expected in lines[0], lines
    assert res.stdout == "" and not (tmp_path / Path(notebook).name).exists() and not list(tmp_path.glob("*.json"))


def test_gpu_check_quick_values_pass_jour1s_own_checks(tmp_path):
    """What ``dlo gpu-check --quick`` gives Jour 1 (fewer repeats, a short sweep) is accepted before a GPU job starts."""
    from dlo.course.gpu_benchmarks import JOUR1_QUICK

    args = [a for name, value in JOUR1_QUICK.items() for a in ("-p", name, value)]
    res = _dry_run("Jour1/jour1.ipynb", "--profile", "full", "--out-dir", str(tmp_path), *args)
    assert res.returncode == 0 and res.stdout.startswith("ok: jour1.ipynb would run with profile='full'"), \
        res.stdout + res.stderr


def test_dry_run_passes_good_values(tmp_path):
    res = _dry_run("tp_fsdp/experts.ipynb", "--profile", "smoke", "--out-dir", str(tmp_path), "-p", "nproc", "3")
    assert res.returncode == 0 and res.stdout.startswith("ok: experts.ipynb would run with profile='smoke', nproc=3"), \
        res.stderr


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the GPU-less case of a full-profile dry run")
def test_a_full_dry_run_without_a_gpu_checks_the_full_profile_as_its_cpu_rehearsal(tmp_path):
    """On a login node (no GPU), a full profile dry run checks the full profile's values as profile 'dry' does on a
    CPU, instead of refusing every run that needs the GPUs of the node it will run on; a refusal says so."""
    ok = _dry_run("tp_fsdp/experts.ipynb", "--profile", "full", "--out-dir", str(tmp_path))
    assert ok.returncode == 0, ok.stderr
    bad = _dry_run("tp_fsdp/experts.ipynb", "--profile", "full", "--out-dir", str(tmp_path), "-p", "nproc", "3")
    assert bad.returncode == 2 and bad.stderr.splitlines() == [
        "error: experts.ipynb: code cell 3 (PROFILES = {) failed with ValueError: nproc must be at least 2 and divide "
        "the 8 experts, got 3 (checked with profile 'dry', the full profile rehearsed on a CPU: this machine has no GPU)"]


@pytest.mark.parametrize("engine", ["papermill", "plain"])
def test_a_real_run_refuses_a_bad_value_in_one_line_before_any_cell_runs(tmp_path, engine):
    """Without --dry-run, values given with -p go through the same checks first: one line, no traceback streamed
    from a cell, no executed notebook written."""
    res = subprocess.run([sys.executable, "-m", "dlo", "run", "Jour1/jour1.ipynb", "--profile", "smoke", "--engine",
                          engine, "--out-dir", str(tmp_path), "-p", "batch_size", "-3"], cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and "batch_size must be a positive integer, got -3" in lines[0], res.stderr
    assert res.stdout == "" and not (tmp_path / "jour1.ipynb").exists()


@pytest.mark.parametrize("value", ["1e999", "[1, 1e999]"])
def test_a_non_finite_value_names_the_parameter(tmp_path, value):
    res = _dry_run("Jour4/llm_memory.ipynb", "--profile", "smoke", "--out-dir", str(tmp_path), "-p", "gpu_memory_gb", value)
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "parameter gpu_memory_gb of llm_memory.ipynb" in res.stderr and "not a finite number" in res.stderr
