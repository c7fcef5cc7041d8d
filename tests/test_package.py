"""The package itself: torchvision works with the CPU torch, caches stay in the project, CLI wiring."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from dlo.runtime.paths import ROOT


def _py(code: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items()
                if k not in ("TORCHINDUCTOR_CACHE_DIR", "TORCH_EXTENSIONS_DIR", "MPLCONFIGDIR", "TRITON_CACHE_DIR")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", code], cwd="/", capture_output=True, text=True, env=full_env,
                          timeout=120)


def test_import_dlo_makes_torchvision_importable():
    res = _py("import dlo, torchvision, json\n"
              "from dlo.runtime import compat as _compat\n"
              "from torchvision.transforms import v2\n"
              "from torchvision.models import resnet18\n"
              "import torch\n"
              "print(json.dumps({'shimmed': _compat.SHIMMED, 'ext': _compat._extension_loads(),\n"
              "                  'out': list(resnet18(num_classes=3).eval()(torch.zeros(1, 3, 32, 32)).shape)}))")
    assert res.returncode == 0, res.stderr
    info = json.loads(res.stdout.strip().splitlines()[-1])
    assert info["out"] == [1, 3]
    # the schemas are declared only when torchvision's own extension cannot load
    assert info["shimmed"] is (not info["ext"])


def test_import_dlo_does_not_import_torch_until_torchvision_is_imported():
    res = _py("import sys, dlo\n"
              "print('torch' in sys.modules, any(type(f).__name__ == '_TorchvisionHook' for f in sys.meta_path))\n"
              "import torchvision\n"
              "print('torch' in sys.modules, any(type(f).__name__ == '_TorchvisionHook' for f in sys.meta_path))")
    assert res.returncode == 0, res.stderr
    # torch stays out of `import dlo`; the hook prepares torchvision's import, then leaves sys.meta_path
    assert res.stdout.split() == ["False", "True", "True", "False"]


def test_runtime_exports_are_lazy_and_the_same_objects():
    res = _py("import sys, importlib, dlo.runtime as rt\n"
              "assert 'torch' not in sys.modules, 'dlo.runtime imported torch'\n"
              "from dlo.course.checks.framework import check  # imports the submodule dlo.runtime.launch\n"
              "from dlo.runtime import launch, distributed\n"
              "assert callable(launch) and callable(distributed) and rt.launch is launch, (launch, distributed)\n"
              "for name in rt.__all__:\n"
              "    mod = importlib.import_module('dlo.runtime.' + rt._EXPORTS[name])\n"
              "    assert getattr(rt, name) is getattr(mod, name), name\n"
              "assert rt.device.__name__ == 'dlo.runtime.device'\n"
              "print(len(rt.__all__))")
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["34"]  # TooFewGPUs joined first_line from dlo.runtime.errors


def test_a_launched_rank_gets_the_failure_hook_on_import_dlo(tmp_path):
    code = "import sys, dlo; print(getattr(sys.excepthook, '_dlo_failure_hook', False))"
    assert _py(code, env={"DLO_RECORDS_DIR": str(tmp_path)}).stdout.split() == ["True"]  # as launch() starts it
    assert _py(code).stdout.split() == ["False"]


def test_caches_go_to_the_project_unless_already_set(tmp_path):
    res = _py("import dlo, os, json; print(json.dumps({k: os.environ[k] for k in "
              "('TORCHINDUCTOR_CACHE_DIR', 'TORCH_EXTENSIONS_DIR', 'MPLCONFIGDIR')}))")
    assert res.returncode == 0, res.stderr
    for path in json.loads(res.stdout.strip().splitlines()[-1]).values():
        assert path.startswith(str(ROOT / ".cache")), path
    res = _py("import dlo, os; print(os.environ['MPLCONFIGDIR'])", env={"MPLCONFIGDIR": str(tmp_path)})
    assert res.stdout.strip().splitlines()[-1] == str(tmp_path)


def test_cli_wiring():
    run = lambda *a: subprocess.run([sys.executable, "-m", "dlo", *a], cwd=ROOT, capture_output=True,  # noqa: E731
                                    text=True, timeout=120)
    res = run("slurm", "notebook", "--cluster", "jean-zay", "--time", "01:00:00")
    assert res.returncode == 0 and "#SBATCH --time=01:00:00" in res.stdout
    res = run("student", "--check")
    assert res.returncode == 0, res.stderr
    res = run("data", "--generated")
    assert res.returncode == 0 and "generated CIFAR-format data" in res.stdout


def _dlo(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dlo", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_cli_docstring_states_the_exit_codes():
    from dlo import cli

    assert "1 a failed check, a stale student notebook or a notebook whose cell failed; 2 a usage" in \
        " ".join(cli.__doc__.split())


def test_slurm_help_and_usage_errors():
    for flag in ("--help", "-h"):
        res = _dlo("slurm", flag)
        assert res.returncode == 0 and res.stdout.startswith("usage: dlo slurm") and "--cluster" in res.stdout
    res = _dlo("slurm")
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "TEMPLATE" in res.stderr
    res = _dlo("slurm", "notebook", "--time", "soon")
    assert res.returncode == 2 and res.stderr.startswith("dlo slurm: error: malformed time")


@pytest.mark.parametrize("args, code, message", [
    ((), 2, "dlo: error: the following arguments are required: COMMAND"),
    (("nope",), 2, "dlo: error: argument COMMAND: invalid choice: 'nope'"),
    (("run",), 2, "dlo run: error: the following arguments are required: notebook"),
    (("run", "Jour1/jour1.ipynb", "--no-such-option"), 2, "dlo: error: unrecognized arguments: --no-such-option"),
    (("run", "Jour1/jour1.ipynb", "--engine", "fast"), 2, "dlo run: error: argument --engine: invalid choice"),
    (("run", "Jour1/nope.ipynb"), 2, "error: no notebook at"),
    (("run", "Jour1/jour1.ipynb", "-p", "nope", "1"), 2, "error: jour1.ipynb has no parameter(s) nope"),
    (("run", "Jour1/jour1.ipynb", "-p", "batch_size", "sixteen"), 2,
     "error: parameter batch_size of jour1.ipynb expects int or None, not 'sixteen' (str)"),
    (("run", "Jour1/jour1.ipynb", "--out-dir", "README.md"), 2, "error: output folder"),
    (("run", "Jour1/jour1.ipynb", "--profile", "fast"), 2, "error: unknown profile 'fast'"),
    (("check", "nope", "nope"), 2, "error: "),
])
def test_usage_errors_exit_2_in_one_line(args, code, message, capsys, monkeypatch):
    from dlo import cli

    monkeypatch.chdir(ROOT)
    try:
        returned = cli.main(list(args))
    except SystemExit as exc:  # argparse's own errors
        returned = exc.code
    assert returned == code
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), lines


def test_a_failed_notebook_exits_1(tmp_path):
    res = _dlo("run", "tests/fixtures/failing.ipynb", "--profile", "smoke", "--quiet", "--out-dir", str(tmp_path))
    assert res.returncode == 1
    assert res.stderr.strip().splitlines()[-1].startswith("error: failing.ipynb: code cell 2 (answer = 1 / zero) failed")
