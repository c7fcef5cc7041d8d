"""A launch of a course script checks the steps its ranks need first (one line, nothing started), and ranks that
fail show as one line each and the log's path, not as their tracebacks."""
from __future__ import annotations

import io
from pathlib import Path

import pytest

from dlo.course.checks import CheckFailed, launching
from dlo.runtime.launch import LaunchError, launch
from dlo.runtime.launch_view import FoldedOutput, RanksFailed, failed_ranks
from dlo.runtime.paths import ROOT

STUDENT = ROOT / "Jour2" / "student" / "dp_scratch_train.py"
SOLUTION = ROOT / "Jour2" / "dp_scratch_train.py"


@pytest.fixture
def launches(monkeypatch):
    calls = []
    monkeypatch.setattr(launching, "launch", lambda *a, **k: calls.append((a, k)) or [{"rank": 0}])
    return calls


def test_unwritten_steps_refuse_the_launch_in_one_line_before_any_process(launches):
    with pytest.raises(CheckFailed) as info:
        launching.launch_checked("dp_scratch", STUDENT, ["--repeats", "1"], nproc=2)
    line = info.value.one_line()
    assert line.startswith("NOT YET dp_scratch/naive: launch refused: dp_scratch_train.py does not pass step(s) "
                           "naive, broadcast, overlap, buckets, no_sync yet; naive: not implemented yet"), line
    assert line.count("dlo hint dp_scratch naive") == 1 and "\n" not in line, line
    assert info.value._render_traceback_() == [f"\x1b[31m{line}\x1b[0m"]  # what the notebook shows: that line only
    assert launches == []  # nothing was started


def test_steps_written_let_the_launch_go(launches):
    assert launching.launch_checked("dp_scratch", SOLUTION, ["--repeats", "1"], nproc=2, steps=["naive"],
                                    timeout_s=60) == [{"rank": 0}]
    (args, kwargs), = launches
    assert args == (SOLUTION, ["--repeats", "1"], 2) and kwargs == {"timeout_s": 60}


def test_the_steps_asked_for_are_the_ones_checked(launches):
    with pytest.raises(CheckFailed, match=r"does not pass step\(s\) overlap yet"):
        launching.launch_checked("dp_scratch", STUDENT, nproc=2, steps=["overlap"])
    assert [f.step for f in launching.steps_not_passing("dp_scratch", STUDENT, ["naive", "buckets"])] == \
        ["naive", "buckets"]
    assert launching.steps_not_passing("dp_scratch", STUDENT, []) == []


LOG = """[torchrun] W1128 torch/distributed/run.py:803] Setting OMP_NUM_THREADS
[rank0] step 1
[rank1] Traceback (most recent call last):
[rank1]   File "x.py", line 3, in <module>
[rank1]     main()
[rank1] NotImplementedError: write step 3 (overlap)
[rank2] Traceback (most recent call last):
[rank2]   File "x.py", line 3, in <module>
[rank2] torch.distributed.DistBackendError: Connection closed by peer
[rank0] still here
[torchrun] torch.distributed.elastic.multiprocessing.errors.ChildFailedError:"""


def test_failed_ranks_are_those_with_a_traceback_each_with_its_exception():
    err = LaunchError("rank 1 of x.py failed", rank=1, last_line="NotImplementedError: write step 3 (overlap)",
                      log=LOG, records_dir=Path("/tmp/launch"))
    assert failed_ranks(err) == {1: "NotImplementedError: write step 3 (overlap)",
                                           2: "torch.distributed.DistBackendError: Connection closed by peer"}
    blamed_two = LaunchError("rank 2 of x.py failed", rank=2, last_line="", log=LOG)
    assert list(failed_ranks(blamed_two)) == [2, 1]  # the launcher's verdict first, then the others
    killed = LaunchError("rank 3 of x.py failed with exit code -9 (SIGKILL)", rank=3, last_line="", log="[rank3] hi")
    assert failed_ranks(killed) == {3: "(no output)"}


def test_the_live_output_leaves_out_tracebacks_and_the_launchers_report():
    out = io.StringIO()
    filt = FoldedOutput(out)
    for line in LOG.splitlines():
        filt.write(line + "\n")
    assert out.getvalue().splitlines() == ["[rank0] step 1", "[rank0] still here"]


FAILS = """\
import os
rank = int(os.environ["RANK"])
print(f"rank {rank} starts", flush=True)
if rank > 0:
    def step():
        raise ValueError(f"bad value on rank {rank}")
    step()
"""


@pytest.mark.parametrize("checked", [True, False], ids=["launch_checked", "launch"])
def test_failing_ranks_show_one_line_each_and_the_log(checked, tmp_path, capsys):
    """Both a checked launch and a plain ``launch()`` (the experts, context, grid and apis notebooks) show one
    line per failed rank, the rank the launcher blames first, and the log's path; the tracebacks are in the log."""
    script = tmp_path / "fails.py"
    script.write_text(FAILS)
    with pytest.raises(RanksFailed) as info:
        if checked:
            launching.launch_checked("dp_scratch", script, nproc=3, steps=[], timeout_s=300,
                                     records_dir=tmp_path / "rec")
        else:
            launch(script, nproc=3, timeout_s=300, records_dir=tmp_path / "rec")
    shown = info.value._render_traceback_()
    assert shown[0] == f"rank {info.value.rank} failed: ValueError: bad value on rank {info.value.rank}"
    assert sorted(shown[:2]) == ["rank 1 failed: ValueError: bad value on rank 1",
                                 "rank 2 failed: ValueError: bad value on rank 2"]
    assert shown[2:] == [f"fails.py on 3 processes failed; every rank's output: {tmp_path / 'rec' / 'launch.log'}"]
    printed = capsys.readouterr().out
    assert "[rank0] rank 0 starts" in printed and "Traceback" not in printed and "[torchrun]" not in printed
    assert "Traceback" in (tmp_path / "rec" / "launch.log").read_text()  # the whole output is in the log
    assert isinstance(info.value, LaunchError) and str(info.value).startswith("rank ")


def test_tracebacks_true_streams_every_line(tmp_path, capsys):
    script = tmp_path / "fails.py"
    script.write_text(FAILS)
    with pytest.raises(LaunchError) as info:
        launch(script, nproc=2, timeout_s=300, records_dir=tmp_path / "rec", tracebacks=True)
    assert not isinstance(info.value, RanksFailed)
    assert "[rank1] Traceback (most recent call last):" in capsys.readouterr().out.splitlines()


def test_a_check_called_from_a_script_without_a_main_guard_runs_once(tmp_path):
    """A student's file that calls a multi-process check at its top level (no ``if __name__ == "__main__":``): the
    ranks run only the checker's worker, not the student's file again (which would start the launch from every
    rank and fail with an empty line)."""
    import subprocess
    import sys

    worker = tmp_path / "worker.py"
    worker.write_text("from dlo.runtime import init_distributed, write_record, exit_after_success\n"
                      "ctx = init_distributed(backend='gloo', device='cpu')\n"
                      "write_record({'ok': True})\nexit_after_success()\n")
    script = tmp_path / "student.py"
    script.write_text("from dlo.course.checks.framework import peer_records\n"
                      "print('top level ran')\n"
                      f"print('ranks', len(peer_records({str(worker)!r}, [], 2, timeout_s=120)))\n")
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.splitlines() == ["top level ran", "ranks 2"], res.stdout
