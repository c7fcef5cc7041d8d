"""Mutation run over the modules the reliability review named: each mutant is a plausible slip; the suite must
fail on every one (a mutant that survives is a test missing).

    .venv/bin/python tools/mutate.py            # all mutants, a summary line each, then the figures
    .venv/bin/python tools/mutate.py --list

Each mutant is applied to a copy of lib/ and tests/ in a temporary folder (the checkout is never touched) and the
tests that cover its module run there (PYTHONPATH puts the copy first). Not part of `make test`: it takes minutes.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str  # relative to the project root
    old: str
    new: str
    tests: tuple[str, ...]
    select: str | None = None  # pytest -k expression: the tests meant to kill it


MUTANTS = (
    Mutant("epoch generator ignores the epoch", "lib/dlo/training/loop.py",
           "manual_seed(seed * 1_000_003 + epoch)", "manual_seed(seed * 1_000_003)",
           ("tests/test_mutants.py",)),
    Mutant("progressive resizing shrinks without antialiasing", "lib/dlo/training/callbacks.py",
           "antialias=shrink)", "antialias=False)", ("tests/test_mutants.py",)),
    Mutant("load_pretrained unpickles anything", "lib/dlo/models/resnets.py",
           "map_location=map_location, weights_only=True)", "map_location=map_location, weights_only=False)",
           ("tests/test_security.py", "tests/test_models.py"), "pretrained"),
    Mutant("checkpoints unpickle anything", "lib/dlo/training/checkpoint.py",
           "map_location=map_location, weights_only=True)", "map_location=map_location, weights_only=False)",
           ("tests/test_security.py",), "checkpoint"),
    Mutant("Ray token created world-readable", "lib/dlo/lessons/hpo/ray.py",
           "os.O_EXCL, 0o600)", "os.O_EXCL, 0o644)", ("tests/test_hpo.py",), "private"),
    Mutant("Ray folder of another user accepted", "lib/dlo/lessons/hpo/ray.py",
           "if st.st_uid != os.getuid():", "if False:", ("tests/test_hpo.py",), "private"),
    Mutant("MixCutMix generator not restored on resume", "lib/dlo/data/augment.py",
           "self.generator.set_state(state[\"generator\"])", "pass", ("tests/test_resume_switches.py",), "mixcutmix"),
    Mutant("dead worker's trial left RUNNING", "lib/dlo/lessons/hpo/journal.py",
           "storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL)", "pass", ("tests/test_hpo.py",),
           "killed_worker"),
    Mutant("dead trials of another host failed too", "lib/dlo/lessons/hpo/journal.py",
           "if t.user_attrs.get(\"host\") != host or", "if", ("tests/test_hpo.py",), "killed_worker"),
    Mutant("EMA weights not restored on resume", "lib/dlo/training/loop.py",
           "ema.load_state_dict(state[\"extra\"][\"ema\"])", "pass", ("tests/test_resume_switches.py",), "ema"),
    Mutant("callback state not restored on resume", "lib/dlo/training/loop.py",
           "obj.load_state_dict(state[\"extra\"][\"stateful\"][key])", "pass", ("tests/test_resume_switches.py",),
           "mixcutmix"),
)


def run(mutant: Mutant, workdir: Path) -> tuple[bool, str]:
    """(killed, reason)."""
    target = workdir / mutant.path
    original = target.read_text()
    if original.count(mutant.old) != 1:
        return False, f"mutation site not found once in {mutant.path} (the code changed: update the mutant)"
    target.write_text(original.replace(mutant.old, mutant.new))
    try:
        env = {**os.environ, "PYTHONPATH": str(workdir / "lib"), "DLO_ROOT": str(ROOT)}
        tests = [t for t in mutant.tests if (workdir / t).exists()]
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                               "-m", "not notebook", *(["-k", mutant.select] if mutant.select else []), *tests],
                              cwd=workdir, env=env, capture_output=True, text=True,
                              timeout=1800)
    finally:
        target.write_text(original)
    if proc.returncode == 0:
        return False, "survived: no test failed"
    failed = [ln for ln in proc.stdout.splitlines() if ln.startswith("FAILED")]
    return True, failed[0] if failed else f"pytest exit {proc.returncode}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python tools/mutate.py", description=__doc__.splitlines()[0])
    p.add_argument("--list", action="store_true", help="list the mutants and exit")
    p.add_argument("-k", default=None, help="run only the mutants whose name contains this text")
    args = p.parse_args(argv)
    mutants = [m for m in MUTANTS if args.k is None or args.k in m.name]
    if args.list:
        for m in mutants:
            print(f"{m.name}: {m.path}")
        return 0
    with tempfile.TemporaryDirectory(prefix="dlo-mutants-") as tmp:
        work = Path(tmp)
        for sub in ("lib", "tests"):
            shutil.copytree(ROOT / sub, work / sub, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        for f in ("pyproject.toml",):
            shutil.copy(ROOT / f, work / f)
        killed = 0
        for m in mutants:
            ok, why = run(m, work)
            killed += ok
            print(f"{'killed  ' if ok else 'SURVIVED'} {m.name}: {why}", flush=True)
    print(f"{killed} killed of {len(mutants)} mutants ({len(mutants) - killed} survived)")
    return 0 if killed == len(mutants) else 1


if __name__ == "__main__":
    sys.exit(main())
