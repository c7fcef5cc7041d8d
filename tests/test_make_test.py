"""What `make test` (CI's command) runs, read from `make -n test`: every stage is there and none is skipped."""
from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from dlo.runtime.paths import ROOT

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def _pytest_commands(target: str = "test", **variables: str) -> list[str]:
    """The pytest command lines of ``make -n TARGET`` (continuation lines joined)."""
    args = [f"{k}={v}" for k, v in variables.items()]
    res = subprocess.run(["make", "-n", target, *args], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "MFLAGS"))})
    assert res.returncode == 0, res.stderr
    text = res.stdout.replace("\\\n", " ")
    return [line for line in text.splitlines() if " -m pytest " in line]


def _variable(command: str, name: str) -> str | None:
    match = re.search(rf"(?:^|\s){name}=(\S*)", command)
    return match.group(1) if match else None


def test_make_test_runs_every_stage_and_rehearses_the_full_profiles():
    commands = _pytest_commands()
    assert len(commands) == 4, commands
    unit, rehearsals, nbval, conclusions = commands
    assert "--ignore=tests/test_dry_profiles.py" in unit and "--ignore=tests/test_launcher.py" not in unit
    assert "--ignore=tests/test_wrong_answers.py" in unit
    # the rehearsals are skipped unless DLO_DRY_PROFILES is set: the stage must set it
    assert "tests/test_dry_profiles.py" in rehearsals and _variable(rehearsals, "DLO_DRY_PROFILES") == "1"
    assert "tests/test_wrong_answers.py" in rehearsals
    assert "--nbval-lax" in nbval and "source_notebooks()" in nbval
    # the plugin that keeps a notebook's cells on one worker (its scheduler) and hands out the longest first
    assert "-p dlo.course.nbval_plugin" in nbval
    assert "tests/test_conclusions.py" in conclusions
    assert "--dist loadfile" in unit  # tests/conftest.py keeps a file per scope, the heavy ones in one


def test_the_heavy_files_exist_and_share_one_scope():
    from conftest import HEAVY_FILES, xdist_scope_of

    for name in HEAVY_FILES:
        assert (ROOT / "tests" / name).is_file(), f"{name} is gone: update HEAVY_FILES in tests/conftest.py"
        assert xdist_scope_of(f"tests/{name}") == "heavy"
    assert xdist_scope_of("tests/test_layers.py") == "tests/test_layers.py"


@pytest.mark.parametrize("workers", ["1", "2", "3", "64"])
def test_each_worker_gets_cores_over_workers_threads_and_ranks_are_forked(workers):
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    unit, rehearsals, nbval, _ = _pytest_commands(TEST_WORKERS=workers, REHEARSAL_WORKERS=workers,
                                                  NBVAL_WORKERS=workers)
    for command in (unit, rehearsals, nbval):
        assert f"-n {workers} " in command, command
        assert _variable(command, "OMP_NUM_THREADS") == str(max(1, cores // int(workers))), command
        assert _variable(command, "DLO_LAUNCHER") == "fork", command


def test_the_torchrun_tests_set_torchrun_back():
    """`make test` forks ranks; the tests of torchrun itself must not be turned into tests of forking."""
    for name in ("test_launcher.py", "test_jour2.py"):
        source = (ROOT / "tests" / name).read_text()
        assert 'monkeypatch.delenv("DLO_LAUNCHER", raising=False)' in source and "autouse=True" in source, name
