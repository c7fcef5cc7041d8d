"""A profile rehearsal does not run the exercise checks again (DLO_SKIP_CHECKS=1); everything else runs them."""
from types import SimpleNamespace

import pytest

from dlo.course import gpu_check
from dlo.course.checks import framework as F


def test_check_runs_the_checker_unless_a_rehearsal_says_not_to(monkeypatch):
    calls = []
    monkeypatch.setitem(F.REGISTRY, "skipdemo", {})
    F.register("skipdemo", "one", ("f",), "Jour1/jour1.ipynb")(lambda f: calls.append(f) or "ran")
    assert F.check("skipdemo", "one", f=len) == "PASSED skipdemo/one: ran" and calls == [len]
    monkeypatch.setenv(F.SKIP_ENV, "1")
    assert F.check("skipdemo", "one", f=len).startswith("SKIPPED skipdemo/one: checks are not run in a profile")
    assert calls == [len]  # not called again
    with pytest.raises(F.CheckFailed, match="define f first"):  # the exercise must still exist
        F.check("skipdemo", "one", {})
    monkeypatch.setenv(F.SKIP_ENV, "0")
    F.check("skipdemo", "one", f=len)
    assert calls == [len, len]


def test_a_rehearsal_sets_it_and_only_for_its_notebook(monkeypatch, tmp_path):
    seen = {}

    def fake_run(cmd, *, timeout_s, cwd, env):
        seen.update(env)
        return SimpleNamespace(seconds=1.0, returncode=0, stdout="", stderr="", timed_out=False)

    monkeypatch.setattr(gpu_check, "run_capped", fake_run)
    monkeypatch.delenv(F.SKIP_ENV, raising=False)
    row = gpu_check.rehearse_notebook("tests/fixtures/plain_display.ipynb", tmp_path / "out", dry=True)
    assert row["verdict"] == "ok" and seen[F.SKIP_ENV] == "1"
    import os
    assert F.SKIP_ENV not in os.environ
