"""The course commands in a terminal: `dlo check`, `dlo hint`, `dlo solution`, `dlo data`.

An unknown course or step is refused before torch is imported (in a fraction of a second, as `dlo hint` does); every
argument of these commands has a help line; a closed pipe (`dlo hint ... | head`) ends the command quietly; a
runs folder that cannot be written says, in one line, that the hint level is not kept.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dlo import cli
from dlo.runtime.paths import ROOT


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})


@pytest.mark.parametrize("args, error", [
    (["check", "jour9", "amp"], "error: unknown course 'jour9': did you mean jour1? the courses are "),
    (["check", "jour1", "nope"], "error: unknown step 'nope' of jour1: its steps are device, amp"),
    (["check", "jour1", "amp", "--notebook", "no/such.ipynb"], "error: no notebook or script at no/such.ipynb"),
    (["hint", "jour9", "amp"], "error: unknown course 'jour9': did you mean jour1? the courses are "),
    (["hint", "jour1", "ampp"], "error: unknown step 'ampp' of jour1: did you mean amp? its steps are "),
    (["solution", "jour1", "ampp"], "error: unknown step 'ampp' of jour1: did you mean amp? its steps are "),
])
def test_check_refuses_an_unknown_step_before_importing_torch(args, error):
    res = _python(f"import sys; from dlo.cli import main; code = main({args!r}); "
                  "print(code, 'torch' in sys.modules)")
    assert res.stdout.split() == ["2", "False"], (res.stdout, res.stderr)
    assert res.stderr.startswith(error) and len(res.stderr.strip().splitlines()) == 1, res.stderr


def _subcommand(name: str):
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sub.choices[name]


@pytest.mark.parametrize("name", ["check", "data", "hint", "solution"])
def test_every_argument_has_a_help_line(name):
    parser = _subcommand(name)
    for action in parser._actions:
        assert action.help and action.help.strip(), f"dlo {name}: {action.option_strings or action.dest} has no help"
    text = " ".join(parser.format_help().split())
    if name == "check":
        assert "`dlo check --list` shows every course and step" in text and "Jour1/student/jour1.ipynb" in text
    if name == "data":
        assert "cifar-10-batches-py" in text and "--generated" in text


@pytest.mark.parametrize("unbuffered", ["", "1"], ids=["buffered", "unbuffered"])
@pytest.mark.parametrize("args", [["hint", "optimizers", "lion"], ["solution", "optimizers", "lion"],
                                  ["check", "-h"]])
def test_a_closed_pipe_ends_quietly(args, unbuffered, tmp_path):
    """`dlo hint ... | head`: the reader is gone before the command writes; no traceback, the SIGPIPE exit code."""
    env = {**os.environ, "DLO_RUNS_DIR": str(tmp_path), "PYTHONUNBUFFERED": unbuffered}
    proc = subprocess.Popen([sys.executable, "-m", "dlo", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    proc.stderr.close()
    code = proc.wait(timeout=300)
    assert err == "", err
    # argparse's --help ignores a failed write itself: written at once (unbuffered), nothing is left to fail
    assert code == cli.CLOSED_PIPE == 141 or (args[-1] == "-h" and unbuffered and code == 0), code


def test_hint_says_the_level_is_not_kept_when_the_runs_folder_cannot_be_written(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")  # a folder below a file cannot be made, whoever runs the test (root included)
    env = {**os.environ, "DLO_RUNS_DIR": str(blocker / "runs")}
    runs = [subprocess.run([sys.executable, "-m", "dlo", "hint", "optimizers", "lion"], cwd=ROOT, capture_output=True,
                           text=True, timeout=300, env=env) for _ in range(2)]
    for res in runs:  # every call gives level 1 again, and says why
        assert res.returncode == 0 and res.stderr == "", res.stderr
        lines = res.stdout.splitlines()
        assert lines[0] == "Hint 1/3 for optimizers/lion:" and len(lines) == 3, lines
        assert lines[2] == (f"(the level reached is not kept: cannot write {blocker / 'runs' / 'hints.json'} (Not a "
                            "directory); `dlo hint optimizers lion --level 2` shows the next one)"), lines[2]
        assert "is kept" not in res.stdout


def test_hint_level_kept_in_a_writable_runs_folder(tmp_path):
    from dlo.course import hints

    state = tmp_path / "hints.json"
    assert hints.advance("optimizers", "lion", state_file=state) == (1, None)
    assert hints.advance("optimizers", "lion", state_file=state) == (2, None)
    level, why = hints.advance("optimizers", "lion", state_file=tmp_path / "a" / "b.json")
    assert (level, why) == (1, None)
    (tmp_path / "file").write_text("")
    level, why = hints.advance("optimizers", "lion", state_file=tmp_path / "file" / "hints.json")
    assert level == 1 and why.startswith(f"cannot write {tmp_path / 'file' / 'hints.json'} (")


def test_a_not_yet_line_points_to_the_hint_once():
    from dlo.course.checks.framework import CheckFailed

    stub = CheckFailed("jour1/amp: not implemented yet -- Run `dlo hint jour1 amp` for a hint.", "jour1", "amp")
    assert stub.one_line().count("dlo hint jour1 amp") == 1
    plain = CheckFailed("the loss is not a tensor", "jour1", "amp")
    assert plain.one_line() == "NOT YET jour1/amp: the loss is not a tensor — hint: dlo hint jour1 amp"
