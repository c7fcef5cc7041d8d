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
    with pytest.raises(ValueError, match="unknown step 'nope' of jour1: its steps are device, amp"):
        checks.check("jour1", "nope", {})


def _dlo(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dlo", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_cli_check_student_fails_and_solution_passes():
    res = _dlo("check", "jour1", "channels_last")  # default: the student notebook
    assert res.returncode == 1 and res.stderr.startswith("NOT YET jour1/channels_last: not implemented yet")
    res = _dlo("check", "jour1", "channels_last", "--notebook", "Jour1/jour1.ipynb")
    assert res.returncode == 0 and res.stdout.startswith("PASSED jour1/channels_last")
    res = _dlo("check", "--list")
    assert res.returncode == 0 and "jour1: device amp" in res.stdout


# --------------------------------------------------------------------------------------------------
# One-line results, hints and solutions
# --------------------------------------------------------------------------------------------------

def test_check_failed_renders_as_one_red_line_in_ipython():
    with pytest.raises(checks.CheckFailed) as info:
        checks.check("jour1", "device", to_device=lambda images, labels, device: (images, labels))
    lines = info.value._render_traceback_()  # what IPython shows instead of a traceback
    assert len(lines) == 1 and "\n" not in lines[0]
    assert lines[0].startswith("\x1b[31mNOT YET jour1/device: ") and lines[0].endswith("\x1b[0m")
    assert "images were not moved" in lines[0] and "hint: dlo hint jour1 device" in lines[0]
    assert "Traceback" not in lines[0]


def test_cli_check_exits_non_zero_on_a_wrong_answer():
    wrong = ROOT / "tests" / "wrong_answers" / "jour1" / "fp16" / "fp16_backward_on_unscaled_loss.py"
    res = _dlo("check", "jour1", "fp16", "--notebook", str(wrong))
    assert res.returncode == 1 and res.stderr.startswith("NOT YET jour1/fp16: ") and "unscaled loss" in res.stderr \
        and res.stderr.rstrip().endswith("hint: dlo hint jour1 fp16") and len(res.stderr.splitlines()) == 1


def test_every_step_has_a_goal_and_three_hint_levels():
    from dlo.course import hints

    steps = {(c, s) for c, st in checks.REGISTRY.items() for s in st}
    assert steps == set(hints.HINTS)
    for (course, step), h in hints.HINTS.items():
        assert h.goal and h.concept and h.tools, f"{course}/{step}"
        assert len(hints.levels(course, step)) == hints.LEVELS == 3
    no_shape = sorted(f"{c}/{s}" for (c, s), h in hints.HINTS.items() if not h.shape)
    assert not no_shape, f"steps without a level-2 hint (the shape of the computation, Hint.shape): {no_shape}"


def test_cli_hint_gives_the_next_level_each_time_and_solution_prints_the_code(tmp_path):
    env = {**__import__("os").environ, "DLO_RUNS_DIR": str(tmp_path)}

    def dlo(*args):
        return subprocess.run([sys.executable, "-m", "dlo", *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=300, env=env)

    outs = [dlo("hint", "optimizers", "lion").stdout for _ in range(4)]
    assert [o.splitlines()[0] for o in outs] == [f"Hint {n}/3 for optimizers/lion:" for n in (1, 2, 3, 3)]
    assert [o.splitlines()[1].split(":")[0] for o in outs[:3]] == ["Idea", "Shape", "API"]
    assert "beta1 * m" not in "".join(outs), "a hint dictates the solution's code"
    assert (tmp_path / "hints.json").is_file()
    assert dlo("hint", "optimizers", "lion", "--level", "1").stdout.splitlines()[0] == "Hint 1/3 for optimizers/lion:"
    sol = dlo("solution", "optimizers", "lion")
    assert sol.returncode == 0 and "new_m = beta2 * m + (1 - beta2) * g" in sol.stdout
    bad = dlo("hint", "jour9", "x")
    assert bad.returncode == 2 and "unknown course 'jour9'" in bad.stderr


def _squeeze(text: str) -> str:
    return "".join(text.split())


def test_stubs_state_the_goal_without_the_solution_code():
    """No solution line of >= 20 non-space characters appears in the generated stub (comment and message)."""
    from dlo.course import student
    from dlo.course.notebooks import source_notebooks

    for src in [*source_notebooks(), *student.source_scripts()]:
        text = (student.make_student_script(src) if src.suffix == ".py"
                else "\n".join(student._source(c) for c in student.make_student(src)["cells"] if c["cell_type"] == "code"))
        stubs = _squeeze("\n".join(line for line in text.splitlines()
                                   if line.strip().startswith(("# TODO:", "# (run `dlo hint", "raise NotImplementedError("))))
        if stubs:
            assert "dlohint" in stubs, f"{src.name}: the stubs must point to `dlo hint`"
        for part in student.source_text(src):
            for name, _, code in student.solution_regions(part):
                for line in code.splitlines():
                    squeezed = _squeeze(line)
                    if len(squeezed) >= 20 and not line.strip().startswith("#"):
                        assert squeezed not in stubs, f"{src.name} ({name}): the stub gives away {line.strip()!r}"
