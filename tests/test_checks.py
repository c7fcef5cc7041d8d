"""Every exercise checker fails on the generated student stub and passes on the solution."""
from __future__ import annotations

import subprocess
import sys

import pytest

from dlo.course import checks
from dlo.runtime.paths import ROOT

STEPS = [(course, step) for course, steps in checks.REGISTRY.items() for step in steps]


@pytest.fixture(scope="module")
def namespaces():
    cache: dict[str, dict] = {}

    def get(path):
        if str(path) not in cache:
            cache[str(path)] = checks.load_exercises(path)
        return cache[str(path)]

    return get


@pytest.mark.parametrize("course, step", STEPS, ids=[f"{c}-{s}" for c, s in STEPS])
def test_checker_passes_on_the_solution(course, step, namespaces):
    chk = checks.REGISTRY[course][step]
    assert checks.check(course, step, namespaces(ROOT / chk.notebook)).startswith(f"PASSED {course}/{step}")


@pytest.mark.parametrize("course, step", STEPS, ids=[f"{c}-{s}" for c, s in STEPS])
def test_checker_fails_on_the_student_stub(course, step, namespaces):
    chk = checks.REGISTRY[course][step]
    with pytest.raises(checks.CheckFailed, match="not implemented yet"):
        checks.check(course, step, namespaces(chk.student_notebook))


def test_checker_reports_a_wrong_answer():
    def train_step_amp(model, images, labels, optimizer, criterion, dtype=None):  # forgot autocast
        loss = criterion(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss.detach()

    with pytest.raises(checks.CheckFailed, match="inside torch.autocast"):
        checks.check("jour1", "amp", train_step_amp=train_step_amp)

    def largest_batch(try_batch, sizes):  # catches every error: hides real bugs
        results = []
        for bs in sizes:
            try:
                results.append(try_batch(bs))
            except Exception:
                break
        return (results[-1]["batch_size"] if results else None), results

    with pytest.raises(checks.CheckFailed, match="only torch.OutOfMemoryError"):
        checks.check("jour1", "batch_sweep", largest_batch=largest_batch)


def test_missing_function_and_unknown_names():
    with pytest.raises(checks.CheckFailed, match="define to_device first"):
        checks.check("jour1", "device", {})
    with pytest.raises(ValueError, match="unknown course 'jour9'"):
        checks.check("jour9", "x", {})
    with pytest.raises(ValueError, match="unknown step 'nope' for jour1"):
        checks.check("jour1", "nope", {})


def _dlo(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dlo", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_cli_check_student_fails_and_solution_passes():
    res = _dlo("check", "jour1", "channels_last")  # default: the student notebook
    assert res.returncode == 1 and res.stderr.startswith("FAILED jour1/channels_last: not implemented yet")
    res = _dlo("check", "jour1", "channels_last", "--notebook", "Jour1/jour1.ipynb")
    assert res.returncode == 0 and res.stdout.startswith("PASSED jour1/channels_last")
    res = _dlo("check", "--list")
    assert res.returncode == 0 and "jour1: device amp" in res.stdout
