"""Shared fixtures. ``as_unprivileged`` and ``read_only_folder`` let permission tests run where CI runs them, as
root: root may write into a read-only folder, so the code under test runs as the user 'nobody' there."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest


def _as_unprivileged(fn):
    """``fn()`` as the user 'nobody' when this process is root (else here); returns what ``fn`` returns
    (JSON-able). When root, ``fn`` runs in a forked child that drops its privileges for good."""
    if os.geteuid() != 0:
        return fn()
    import pwd

    nobody = pwd.getpwnam("nobody")
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop privileges, run, report, exit without running pytest's cleanups
        code = 1
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            with os.fdopen(write_end, "w") as out:
                try:
                    out.write(json.dumps(fn()))
                    code = 0
                except BaseException:  # report it to the parent, which fails the test with it
                    import traceback

                    out.write(traceback.format_exc())
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end) as inp:
        text = inp.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, text
    return json.loads(text)


@pytest.fixture
def as_unprivileged():
    return _as_unprivileged


@pytest.fixture
def read_only_folder():
    """``(read_only, writable)``: two folders that 'nobody' can enter, the first without write permission
    (outside pytest's tmp folder, which only root may enter)."""
    base = Path(tempfile.mkdtemp(prefix="dlo-perm-"))
    try:
        base.chmod(0o755)
        (base / "ro").mkdir(mode=0o555)
        (base / "ro").chmod(0o555)
        (base / "rw").mkdir()
        (base / "rw").chmod(0o777)
        yield base / "ro", base / "rw"
    finally:
        (base / "ro").chmod(0o755)
        shutil.rmtree(base, ignore_errors=True)


# ---------------------------------------------------------------- a small file system, to fill
def mount_tmpfs(folder: Path, size: str) -> bool:
    """Mount a tmpfs of ``size`` (e.g. "64k") on ``folder``: a disk that fills up for real. Needs root and
    ``mount``; False (nothing mounted) otherwise, and the caller skips."""
    import subprocess

    if not hasattr(os, "geteuid") or os.geteuid() != 0 or not shutil.which("mount"):
        return False
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                         capture_output=True, timeout=30)
    return res.returncode == 0


# ---------------------------------------------------------------- a GPU node's bare Python
BARE_NODE = Path(__file__).with_name("bare_node")


def bare_node_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) for a Python that cannot import the Jupyter stack, as on a GPU node
    (tests/bare_node/sitecustomize.py is imported at its start-up)."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(BARE_NODE), env.get("PYTHONPATH")]))
    return env


# ---------------------------------------------------------------- one file at a time, the heavy ones together
#: Test files that start servers with a fixed start-up window: Ray's raylet (its agents must report within ~15 s),
#: torchrun's rendezvous, ``accelerate launch``. Two of them at once on a busy 2-core machine starve each other past
#: those windows. Under ``--dist loadfile`` (`make test`'s unit stage) these files are one scope, which one xdist
#: worker runs one test after another; every other file stays a scope of its own. (xdist's ``loadgroup`` would do
#: it with marks, but its group suffix is lost under pytest 9, whose node ids no longer come from ``_nodeid``.)
HEAVY_FILES = frozenset({"test_hpo_ray.py", "test_launcher.py", "test_launch_safety.py", "test_jour2.py",
                         "test_apis.py"})


def xdist_scope_of(file_scope: str) -> str:
    """The scope of a test file under ``--dist loadfile``: "heavy" for :data:`HEAVY_FILES`, else the file."""
    return "heavy" if Path(file_scope).name in HEAVY_FILES else file_scope


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class HeavyFilesTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_scope_of(super()._split_scope(nodeid))

    return HeavyFilesTogether(config, log)


# ---------------------------------------------------------------- the wrong-answer corpus's rejection rate
# test_wrong_answers.py records, per answer, whether its checker rejected it (``record_property``). The
# properties travel with the test reports, from every xdist worker to the process that prints the summary.
_WRONG_ANSWERS: dict[str, bool] = {}


def pytest_runtest_logreport(report):
    if report.when != "call":
        return
    props = dict(report.user_properties)
    if "wrong_answer" in props:
        _WRONG_ANSWERS[props["wrong_answer"]] = bool(props.get("wrong_answer_rejected", False))


def pytest_terminal_summary(terminalreporter):
    if not _WRONG_ANSWERS:
        return
    corpus = Path(__file__).with_name("wrong_answers")
    files = sorted(corpus.glob("*/*/*.py"))
    steps_in_corpus = {p.parent.relative_to(corpus) for p in files}
    steps_run = {name.rsplit("/", 1)[0] for name in _WRONG_ANSWERS}
    rejected = sum(_WRONG_ANSWERS.values())
    terminalreporter.write_line(
        f"wrong-answer corpus: {len(files)} answers over {len(steps_in_corpus)} steps; this run: {len(_WRONG_ANSWERS)} "
        f"answers over {len(steps_run)} steps, {rejected} rejected ({100 * rejected / len(_WRONG_ANSWERS):.0f}%)")
