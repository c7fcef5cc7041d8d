"""Every notebook's full profile, rehearsed on a CPU: ``dlo run NOTEBOOK --engine plain --profile dry``.

The ``dry`` profile is the notebook's ``full`` profile (its lists, branches and record writing) with only the
sizes that make it long scaled down (``PROFILES["dry"]``, see :func:`dlo.course.notebooks.profile_settings`).
Running it finds, in minutes on a CPU, a crash that only the full profile reaches, before a GPU job does.
GPU-only calls (CUDA events, NCCL, cudnn.benchmark, fp8) are not run here: they sit behind small functions
tested on their own, and ``dlo gpu-check`` runs them on a GPU node.

Run by ``make test`` (its second stage, beside the wrong-answer corpus) and ``make test-dry``; skipped otherwise,
since each notebook starts its own Python and takes from seconds to two minutes.
Multi-process launches fork their ranks (``DLO_LAUNCHER=fork``, :func:`dlo.runtime.launch.launch`): a rehearsal
starts dozens of short runs, and torchrun would spend most of their time importing torch in every rank. torchrun
itself is what students and batch jobs use; tests/test_launcher.py and tests/test_jour2.py test it.

Each rehearsal runs in a Python that looks like a GPU node's (``conftest.bare_node_env``): the Jupyter stack
(IPython, ipykernel, nbformat, papermill, jupyter) cannot be imported, so the plain engine's displays, figures and
tables are exercised as they run there. The run itself is :func:`dlo.course.gpu_check.rehearse_notebook`, what
``dlo gpu-check --quick`` runs on a GPU node.
"""
from __future__ import annotations

import json
import os

import pytest

from conftest import bare_node_env
from dlo.course.gpu_check import rehearse_notebook
from dlo.course.notebooks import source_notebooks
from dlo.runtime.paths import ROOT

if not os.environ.get("DLO_DRY_PROFILES"):
    pytest.skip("full-profile rehearsals: run them with `make test-dry`", allow_module_level=True)

# The longest rehearsals first, so that none of them starts last and runs alone at the end. Measured in make test's
# second stage on a 2-core CPU: hpo 220 s, jour1 90 s (more with a cold Inductor cache, as jit), fsdp, pipeline and
# the race 55-60 s, inference 45 s; the others 10-35 s.
LONGEST_FIRST = ("Jour4/hpo.ipynb", "Jour1/jour1.ipynb", "tp_fsdp/fsdp.ipynb", "tp_pipeline/pipeline.ipynb",
                 "Jour4/cifar_race.ipynb", "Jour4/inference.ipynb", "Jour3/jit.ipynb")
NOTEBOOKS = sorted(source_notebooks(), key=lambda p: (str(p.relative_to(ROOT)) not in LONGEST_FIRST,
                                                      LONGEST_FIRST.index(str(p.relative_to(ROOT)))
                                                      if str(p.relative_to(ROOT)) in LONGEST_FIRST else 0))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[str(p.relative_to(ROOT)) for p in NOTEBOOKS])
def test_the_full_profile_runs_on_a_cpu_scaled_down(path, tmp_path):
    out = tmp_path / path.stem
    env = bare_node_env({**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "DLO_LAUNCHER": "fork"})
    row = rehearse_notebook(path, out, timeout_s=900, dry=True, env=env)
    if row["verdict"].startswith("skipped: needs") and row["verdict"].endswith("(not installed here)"):
        pytest.skip(f"{path.relative_to(ROOT)}: {row['verdict']}")  # e.g. Optuna in `make test-compat`'s GPU-node venv
    tail = "\n".join(row.get("output_tail", []))
    assert row["verdict"] == "ok", f"{path.relative_to(ROOT)} (profile dry, no Jupyter stack): {row['verdict']}\n{tail}"
    results = out / "results.json"
    if results.exists():  # what a notebook records says which profile produced it (shapes' "profile" is a profiler's)
        profile = json.loads(results.read_text()).get("profile")
        assert not isinstance(profile, str) or profile == "dry", f"{results}: recorded profile {profile!r}, ran 'dry'"
