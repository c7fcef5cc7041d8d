"""Every course script refuses a bad option in one line, before any work starts.

On a cluster the output of a refused launch lands in a log read after the queue wait: it must be one line that names
the option (``prog: error: argument --x: ... (see prog --help)``), exit code 2, and come before the script imports
torch or starts a process group. The scripts run by path (torchrun's workers) are run here in a subprocess where
importing torch fails: a script that got that far before refusing fails these tests with an ImportError. A check
that needs the launch's process count reads it from torchrun's variables (``WORLD_SIZE``, ``RANK``), as the script
does before any process group. The ``dlo`` commands (``dlo train``, ``dlo race``, ``dlo mix-bench``) are called in
this process, with their work replaced by a function that fails the test if it is called.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from dlo.lessons import mixing, race
from dlo.runtime.paths import ROOT
from dlo.training import cli as training_cli

#: Runs each case's script as ``__main__`` with torch made unimportable (the parser must answer first), all cases in
#: one process (a process start costs more than the cases): a JSON list of [exit code, stdout, stderr], in order.
NO_TORCH = """
import contextlib, io, json, os, runpy, sys
sys.modules['torch'] = None
results = []
for script, launch, argv in json.load(sys.stdin):
    os.environ.update(launch)
    out, err, code = io.StringIO(), io.StringIO(), 0
    sys.argv = [script, *argv]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_path(script, run_name='__main__')
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException as exc:
            code, err = 1, io.StringIO(f'{type(exc).__name__}: {exc}')
    for k in launch:
        del os.environ[k]
    results.append([code, out.getvalue(), err.getvalue()])
print(json.dumps(results))
"""

W2 = {"WORLD_SIZE": "2", "RANK": "0"}
W4 = {"WORLD_SIZE": "4", "RANK": "0"}

# (script, launch variables, options, what the line must name)
BAD = [
    ("tp_pipeline/pipeline_train.py", {}, ["--layers", "0"], "argument --layers: must be >= 1, got 0"),
    ("tp_pipeline/pipeline_train.py", {}, ["--micro-batches", "4", "-5"], "argument --micro-batches: must be >= 1"),
    ("tp_pipeline/pipeline_train.py", {}, ["--hidden", "30", "--heads", "4"], "argument --heads: 4 heads do not divide"),
    ("tp_pipeline/grid_train.py", {}, ["--tp", "0"], "argument --tp: must be >= 1, got 0"),
    ("tp_pipeline/grid_train.py", {}, ["--batch", "15", "--micro-batches", "4"], "argument --batch: 15 sequences"),
    ("tp_pipeline/grid_train.py", W4, ["--dp", "2", "--tp", "1"], "layout --dp 2 x --pp 1 x --tp 1 = 2 processes"),
    ("Jour2/ddp_train.py", {}, ["--global-batch", "0"], "argument --global-batch: must be >= 1, got 0"),
    ("Jour2/ddp_train.py", {}, ["--epochs", "-5"], "argument --epochs: must be >= 1, got -5"),
    ("Jour2/ddp_train.py", W2, ["--global-batch", "63"], "global batch 63 is not divisible by world size 2"),
    ("Jour2/dp_scratch_train.py", W2, ["--accum", "0"], "argument --accum: must be >= 1, got 0"),
    ("Jour2/dp_scratch_train.py", W2, ["--hidden", "512,-5"], "argument --hidden: must be >= 1, got -5"),
    ("Jour2/dp_scratch_train.py", {}, [], "run it on several processes"),
    ("tp_tensor_parallel/tp_balises.py", {}, ["--steps", "0"], "argument --steps: must be >= 1, got 0"),
    ("tp_tensor_parallel/tp_balises.py", W4, ["--layouts", "2x1"], "argument --layouts: 2x1 needs tp x dp = 2"),
    ("tp_tensor_parallel/tp_balises.py", W4, ["--layouts", "4x1", "--intermediate", "250"],
     "argument --intermediate: tp=4 (layout 4x1) does not divide 250"),
    ("lib/dlo/parallel/experts_worker.py", W2, ["--batch-per-rank", "-5"], "argument --batch-per-rank: must be >= 1"),
    ("lib/dlo/parallel/experts_worker.py", W4, ["--configs", "6:2:none"],
     "argument --configs: 6 experts cannot be split evenly over ep=4"),
    ("lib/dlo/parallel/experts_worker.py", W4, ["--ep", "3"], "argument --ep: ep=3 must divide the world size 4"),
    ("lib/dlo/parallel/context_worker.py", W2, ["--seq", "0"], "argument --seq: must be >= 1, got 0"),
    ("lib/dlo/parallel/context_worker.py", W2, ["--heads", "6:4"], "argument --heads: '6:4': num_heads=6"),
    ("lib/dlo/parallel/context_worker.py", W4, ["--seq", "12"], "argument --seq: sequence length 12 must be a multiple of 8"),
    ("lib/dlo/parallel/context_worker.py", W2, ["--layouts", "balanced,zigzag"],
     "argument --layouts: unknown layout(s) 'zigzag': use balanced, contiguous"),
    ("lib/dlo/parallel/experts_worker.py", W2, ["--dtypes", "float32,float16"],
     "argument --dtypes: unknown dtype(s) 'float16': use float32, float64"),
]
SCRIPTS = sorted({script for script, _, _, _ in BAD})


RANK3_OF_4 = ("tp_pipeline/grid_train.py", {"WORLD_SIZE": "4", "RANK": "3"}, ["--dp", "2", "--tp", "1"])
CASES = [(s, launch, argv) for s, launch, argv, _ in BAD] + [(s, {}, ["--help"]) for s in SCRIPTS] + [RANK3_OF_4]


@pytest.fixture(scope="module")
def ran() -> dict:
    """Every case run once: ``{(script, launch, argv): (exit code, stdout, stderr)}``."""
    env = {k: v for k, v in os.environ.items()  # this test's own launch (a Slurm job, a torchrun) is not the script's
           if not k.startswith("SLURM_") and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    cases = [(str(ROOT / s), launch, argv) for s, launch, argv in CASES]
    res = subprocess.run([sys.executable, "-c", NO_TORCH], input=json.dumps(cases), cwd=ROOT, text=True,
                         capture_output=True, timeout=300, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    return {_key(*case): tuple(r) for case, r in zip(CASES, json.loads(res.stdout))}


def _key(script: str, launch: dict, argv: list[str]) -> tuple:
    return script, tuple(sorted(launch.items())), tuple(argv)


@pytest.mark.parametrize("script,launch,argv,words", BAD,
                         ids=[f"{s.rsplit('/', 1)[-1]}:{' '.join(a) or 'one process'}" for s, _, a, _ in BAD])
def test_a_bad_option_is_one_line_before_torch(ran, script, launch, argv, words):
    code, out, err = ran[_key(script, launch, argv)]
    name = script.rsplit("/", 1)[-1]
    assert code == 2, err[-1500:]
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"{name}: error: ") and lines[0].endswith(f"(see {name} --help)"), lines[0]
    assert words in lines[0], lines[0]


def test_every_rank_says_why_a_layout_cannot_run(ran):
    """A launcher stops the other ranks at the first that fails, whichever it is: each must leave the line."""
    code, out, err = ran[_key(*RANK3_OF_4)]
    assert (code, out) == (2, "") and err == ran[_key(RANK3_OF_4[0], W4, RANK3_OF_4[2])][2] != ""


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_still_works_without_torch(ran, script):
    code, out, err = ran[_key(script, {}, ["--help"])]
    assert code == 0 and err == "", err[-1500:]
    assert out.startswith(f"usage: {script.rsplit('/', 1)[-1]}")


# --------------------------------------------------------------------------------------------------
# The dlo commands, in this process: nothing runs when an option is refused
# --------------------------------------------------------------------------------------------------
def _never(*args, **kwargs):
    raise AssertionError("work started although the options were refused")


@pytest.fixture()
def nothing_runs(monkeypatch):
    monkeypatch.setattr(training_cli, "_main", _never)
    monkeypatch.setattr(race, "run_race", _never)
    monkeypatch.setattr(race, "validation_run", _never)
    monkeypatch.setattr(mixing, "benchmark", _never)
    monkeypatch.setattr(mixing, "pick_device", _never)


COMMANDS = {"train": training_cli.main, "race": race.main, "mix-bench": mixing.main}
BAD_COMMANDS = [
    ("train", ["--batch-size", "0"], "argument --batch-size: must be >= 1, got 0"),
    ("train", ["--ckpt-every", "-5", "--ckpt", "ck.pt"], "argument --ckpt-every: must be >= 1, got -5"),
    ("train", ["--tta"], "--tta changes the evaluation: add --eval"),
    ("train", ["--device", "gpu"], "argument --device: unknown device 'gpu'"),
    ("race", ["--repeats", "0"], "argument --repeats: must be >= 1, got 0"),
    ("race", ["--target", "94"], "argument --target: target accuracy must be in (0, 1]"),
    ("race", ["--validation", "64", "--n-test", "100"], "--validation never reads the test set"),
    ("race", ["--set", "widht=2"], "argument --set: unknown Recipe field(s) widht"),
    ("mix-bench", ["--batch-size", "0"], "argument --batch-size: must be >= 1, got 0"),
    ("mix-bench", ["--threads", "-5"], "argument --threads: must be >= 1, got -5"),
    ("mix-bench", ["--kinds", "mixcut"], "argument --kinds: invalid choice: 'mixcut'"),
]


@pytest.mark.parametrize("command,argv,words", BAD_COMMANDS, ids=[f"{c}:{' '.join(a)}" for c, a, _ in BAD_COMMANDS])
def test_a_bad_option_of_a_dlo_command_is_one_line(command, argv, words, nothing_runs, capsys):
    assert COMMANDS[command](argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.splitlines()) == 1, err
    prog = f"python -m dlo {command}"
    assert err.startswith(f"{prog}: error: ") and err.rstrip().endswith(f"(see {prog} --help)"), err
    assert words in err, err


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_help_of_a_dlo_command(command, nothing_runs, capsys):
    assert COMMANDS[command](["--help"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"usage: python -m dlo {command}") and err == ""
