"""Jour 2's course script (Jour2/ddp_train.py): it runs alone and under torchrun, and bad input gives one line."""
from __future__ import annotations

import subprocess
import sys

import pytest

import dlo  # noqa: F401
from dlo.runtime import LaunchError, launch
from dlo.runtime.paths import ROOT

SCRIPT = ROOT / "Jour2" / "ddp_train.py"
TINY = ["--width", "4", "--n-train", "256", "--max-steps", "3", "--warmup-steps", "1"]


@pytest.fixture(autouse=True)
def _under_torchrun(monkeypatch):
    """The multi-process tests run the script under torchrun, as a student does (`make test` sets DLO_LAUNCHER=fork)."""
    monkeypatch.delenv("DLO_LAUNCHER", raising=False)


def test_script_runs_as_a_single_plain_process(tmp_path):
    res = subprocess.run([sys.executable, str(SCRIPT), *TINY, "--global-batch", "32",
                          "--checkpoint", str(tmp_path / "ck.pt")],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "1 process(es) (single)" in res.stdout and "median step" in res.stdout
    assert (tmp_path / "ck.pt").is_file()


@pytest.mark.distributed
def test_global_batch_not_divisible_by_world_size_is_one_clear_line(tmp_path):
    with pytest.raises(LaunchError) as err:
        launch(SCRIPT, [*TINY, "--global-batch", "63"], nproc=2, records_dir=tmp_path, timeout_s=240,
               use_srun=False, echo=False, env={"OMP_NUM_THREADS": "1"})
    assert "global batch 63 is not divisible by world size 2" in err.value.last_line


@pytest.mark.distributed
def test_sync_batchnorm_on_cpu_is_refused_in_one_line(tmp_path):
    with pytest.raises(LaunchError) as err:
        launch(SCRIPT, [*TINY, "--global-batch", "64", "--sync-bn"], nproc=2, records_dir=tmp_path,
               timeout_s=240, use_srun=False, echo=False, env={"OMP_NUM_THREADS": "1"})
    assert "SyncBatchNorm runs on GPUs only" in err.value.last_line


def test_unknown_run_option_is_one_clear_line(tmp_path):
    res = subprocess.run([sys.executable, str(SCRIPT), *TINY, "--runs", '[{"bucket_cap": 1}]'],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert res.returncode != 0 and "sets unknown option(s) bucket_cap" in res.stderr
