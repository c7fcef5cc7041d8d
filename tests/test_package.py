"""The package itself: torchvision works with the CPU torch, caches stay in the project, CLI wiring."""
from __future__ import annotations

import json
import os
import subprocess
import sys

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
