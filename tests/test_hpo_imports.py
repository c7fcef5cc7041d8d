"""A journal worker (``dlo hpo worker``: one process per worker, on a toy function) does not import torch.

The notebook starts four of them at once, and one more to kill: each spent seconds importing torch and torchvision
for the CIFAR trainer it never uses (``dlo.lessons.hpo`` now loads its trainer on first use)."""
from __future__ import annotations

import json
import subprocess
import sys


def test_a_journal_worker_imports_neither_torch_nor_the_trainer():
    heavy = ("torch", "torchvision", "dlo.lessons.hpo.trainer")
    code = ("import json, sys; from dlo.lessons.hpo import journal; journal.run_worker; "
            f"print(json.dumps(sorted(m for m in {heavy!r} if m in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_the_trainers_names_still_come_from_the_package():
    from dlo.lessons import hpo
    from dlo.lessons.hpo import trainer

    assert hpo.Trainer is trainer.Trainer and hpo.load_cifar_tensors is trainer.load_cifar_tensors
    assert set(hpo.__all__) <= set(dir(hpo))
