"""dp_scratch_train.py --versions: the short launches of Jour2/dp_scratch.ipynb time only the versions written so
far (with the compute-only step and DDP), so that a launch right after step 3 needs no bucket or no_sync code."""
from __future__ import annotations

import pytest

import dlo  # noqa: F401
from dlo.course.exercises import load_exercises
from dlo.runtime.launch import launch_forked
from dlo.runtime.paths import ROOT

SCRIPT = ROOT / "Jour2" / "dp_scratch_train.py"


def test_unknown_versions_are_refused_and_all_are_the_default():
    ns = load_exercises(SCRIPT)
    assert ns["parse_args"]([]).versions == ["naive", "overlap", "buckets", "accumulate"]
    with pytest.raises(SystemExit):
        ns["parse_args"](["--versions", "naive,bogus"])


@pytest.mark.distributed
def test_a_launch_after_step_3_times_only_what_is_written(tmp_path):
    args = ["--image-size", "4", "--hidden", "16,16", "--per-rank-batch", "4", "--repeats", "2",
            "--warmup-max-calls", "4", "--gantt-steps", "1", "--drift-steps", "1", "--versions", "naive,overlap"]
    records = launch_forked(SCRIPT, args, nproc=2, records_dir=tmp_path, timeout_s=300, env={"OMP_NUM_THREADS": "1"})
    timed = {r["name"] for r in records if r["kind"] == "timing"}
    assert timed == {"compute only", "naive", "overlap", "DDP (25 MiB default)"}
    assert {r["version"] for r in records if r["kind"] == "events"} == {"naive", "overlap", "DDP (25 MiB default)"}
    assert next(r for r in records if r["kind"] == "setup")["plans"] == {}
