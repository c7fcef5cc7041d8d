"""Slurm templates and dlo.runtime.slurm.render: valid bash, requested #SBATCH values, clear errors."""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dlo.runtime import paths
from dlo.runtime import slurm

BASH = shutil.which("bash")
needs_bash = pytest.mark.skipif(BASH is None, reason="bash not installed")


def sbatch_options(script: str) -> dict[str, str]:
    """The #SBATCH options sbatch would read (leading comment block only): {"--time": "01:00:00", "--requeue": ""}."""
    out: dict[str, str] = {}
    for line in script.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            break
        m = re.match(r"^#SBATCH\s+(--[\w-]+)(?:=(\S*))?", line)
        if m:
            assert m[1] not in out, f"{m[1]} appears twice"
            out[m[1]] = m[2] or ""
    return out


def bash_n(script: str, tmp_path) -> None:
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    res = subprocess.run([BASH, "-n", str(path)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


@needs_bash
@pytest.mark.parametrize("name", slurm.TEMPLATES)
def test_templates_on_disk_pass_bash_n(name, tmp_path):
    path = paths.ROOT / "slurm" / f"{name}.sbatch"
    res = subprocess.run([BASH, "-n", str(path)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    text = path.read_text()
    assert text.startswith("#!/bin/bash\n")
    assert "set -euo pipefail" in text
    assert slurm.MODULES_MARKER in text.splitlines()


@pytest.mark.parametrize("name", slurm.TEMPLATES)
def test_template_defaults(name):
    opts = sbatch_options((paths.ROOT / "slurm" / f"{name}.sbatch").read_text())
    for key in ("--job-name", "--nodes", "--gpus-per-node", "--cpus-per-task", "--time", "--signal", "--requeue"):
        assert key in opts, f"{name}: no default {key}"
    assert opts["--output"] == "runs/slurm/%x-%j.out"
    assert opts["--signal"] == "B:USR1@120"
    assert opts["--nodes"] == "1"
    if name == "notebook":
        assert opts["--ntasks"] == "1" and opts["--gpus-per-node"] == "1"
    else:
        assert opts["--ntasks-per-node"] == opts["--gpus-per-node"]  # one task per GPU


def test_notebook_template_runs_offline_with_dsdir():
    text = (paths.ROOT / "slurm" / "notebook.sbatch").read_text()
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "DLO_DATA_DIR", "DSDIR"):
        assert var in text
    assert "dlo run" in text and "SLURM_SUBMIT_DIR" in text and ".venv/bin/activate" in text


CASES = [
    {},
    {"account": "abc@h100", "constraint": "h100", "time": "20:00:00", "qos": "qos_gpu_h100-t3"},
    {"partition": "gpu", "gpus_per_node": 2, "cpus_per_task": 6, "job_name": "jour1", "time": 90,
     "extra_sbatch": ["--mail-type=END", "exclusive"], "modules": ["cuda/12.4", "pytorch-gpu/py3/2.7.0"]},
]


@needs_bash
@pytest.mark.parametrize("cluster", sorted(slurm.CLUSTERS))
@pytest.mark.parametrize("name", slurm.TEMPLATES)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_render_is_valid_bash_with_requested_values(name, cluster, case, tmp_path):
    kwargs = CASES[case]
    script = slurm.render(name, cluster=cluster, **kwargs)
    bash_n(script, tmp_path)
    opts = sbatch_options(script)
    for key, flag in [("account", "--account"), ("partition", "--partition"), ("qos", "--qos"),
                      ("constraint", "--constraint"), ("job_name", "--job-name"), ("time", "--time"),
                      ("gpus_per_node", "--gpus-per-node"), ("cpus_per_task", "--cpus-per-task")]:
        if key in kwargs:
            assert opts[flag] == str(kwargs[key]), flag
    if name == "torchrun":
        assert opts["--ntasks-per-node"] == opts["--gpus-per-node"]
    # defaults stay unless replaced
    assert opts["--output"] == "runs/slurm/%x-%j.out" and opts["--signal"] == "B:USR1@120" and "--requeue" in opts
    assert opts["--nodes"] == "1"
    if "time" not in kwargs:
        assert opts["--time"] in ("01:00:00", "02:00:00")
    if "extra_sbatch" in kwargs:
        assert opts["--mail-type"] == "END" and "--exclusive" in opts
    if cluster == "jean-zay":
        assert opts["--hint"] == "nomultithread"
    else:
        assert "--hint" not in opts
    lines = script.splitlines()
    marker = lines.index(slurm.MODULES_MARKER)
    loads = [line for line in lines if line.startswith("module ")]
    if kwargs.get("modules"):
        assert lines[marker + len(loads)] == f"module load {kwargs['modules'][-1]}"
        assert loads[-2:] == [f"module load {m}" for m in kwargs["modules"]]
        assert (loads[0] == "module purge") == (cluster == "jean-zay")
    else:
        assert loads == []


def test_render_torchrun_multi_node_and_jean_zay_cores():
    script = slurm.render("torchrun", cluster="jean-zay", account="abc@h100", constraint="h100", nodes=2,
                          gpus_per_node=4, modules=["pytorch-gpu/py3/2.7.0"])
    opts = sbatch_options(script)
    assert (opts["--nodes"], opts["--ntasks-per-node"], opts["--gpus-per-node"]) == ("2", "4", "4")
    assert opts["--cpus-per-task"] == "24"  # per GPU on Jean Zay's H100 nodes
    assert "module load arch/h100" in script.splitlines()
    nb = sbatch_options(slurm.render("notebook", cluster="jean-zay", constraint="a100", gpus_per_node=2))
    assert nb["--cpus-per-task"] == "16" and nb["--ntasks"] == "1"  # one task holding 2 GPUs x 8 cores
    generic = sbatch_options(slurm.render("torchrun", nodes=3, time="1-00:00:00"))
    assert generic["--cpus-per-task"] == "8" and generic["--nodes"] == "3" and generic["--time"] == "1-00:00:00"


def test_render_keeps_comments_and_extra_overrides_template_line():
    template = (paths.ROOT / "slurm" / "notebook.sbatch").read_text().splitlines()
    script = slurm.render("notebook", cpus_per_task=4, extra_sbatch=["--signal=USR1@120"]).splitlines()
    old = next(line for line in template if line.startswith("#SBATCH --cpus-per-task="))
    new = next(line for line in script if line.startswith("#SBATCH --cpus-per-task="))
    assert new.startswith("#SBATCH --cpus-per-task=4 ")
    assert new.index("#", 1) == old.index("#", 1)  # the comment stays in its column
    assert sbatch_options("\n".join(script))["--signal"] == "USR1@120"
    assert sum(line.startswith("#SBATCH --signal") for line in script) == 1


@pytest.mark.parametrize("kwargs, message", [
    ({"template": "nope"}, "unknown Slurm template"),
    ({"cluster": "nope"}, "unknown cluster"),
    ({"nodes": 0}, "nodes"),
    ({"nodes": -2}, "nodes"),
    ({"gpus_per_node": 0}, "gpus_per_node"),
    ({"cpus_per_task": "many"}, "cpus_per_task"),
    ({"time": "1:2:3:4"}, "malformed time"),
    ({"time": "01:75:00"}, "malformed time"),
    ({"time": "2 hours"}, "malformed time"),
    ({"time": "0"}, "zero"),
    ({"account": "my account"}, "account"),
    ({"partition": "gpu\n#SBATCH --x"}, "partition"),
    ({"extra_sbatch": ["--mail-type=END\nrm -rf /"]}, "extra"),
    ({"extra_sbatch": "--exclusive"}, "lists"),
    ({"extra_sbatch": ["--mail-type END"]}, "--name=value"),
    ({"time": "01:00:00", "extra_sbatch": ["--time=02:00:00"]}, "twice"),
    ({"modules": ["cuda; rm -rf ~"]}, "module"),
    ({"cluster": "jean-zay", "account": "abc@a100", "constraint": "h100"}, "abc@h100"),
    # what Jean Zay itself would refuse: a time above the QoS's limit, a node feature or a GPU count it lacks
    ({"cluster": "jean-zay", "time": "100:00:00"}, "above the 20 h of the default QoS"),
    ({"cluster": "jean-zay", "time": "2-00:00:00", "qos": "qos_gpu_h100-t3"}, "above the 20 h"),
    ({"cluster": "jean-zay", "time": "02:00:01", "qos": "qos_gpu_h100-dev"}, "above the 2 h"),
    ({"cluster": "jean-zay", "time": "4-05:00:00", "qos": "qos_gpu-t4"}, "above the 100 h"),
    ({"cluster": "jean-zay", "constraint": "h100", "gpus_per_node": 8}, "have 4 GPUs, not 8"),
    ({"cluster": "jean-zay", "partition": "gpu_p5", "gpus_per_node": 9}, "have 8 GPUs, not 9"),
    ({"cluster": "jean-zay", "constraint": "h200"}, "no jean-zay node has the feature --constraint h200"),
])
def test_invalid_options_raise_one_line_value_error(kwargs, message):
    kwargs = dict(kwargs)
    template = kwargs.pop("template", "torchrun")
    with pytest.raises(ValueError) as err:
        slurm.render(template, **kwargs)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_jean_zay_limits_let_what_the_cluster_accepts_through():
    for kwargs in ({"time": "20:00:00"}, {"time": "02:00:00", "qos": "qos_gpu_h100-dev"},
                   {"time": "100:00:00", "qos": "qos_gpu-t4"}, {"constraint": "h100", "gpus_per_node": 4},
                   {"constraint": "a100", "gpus_per_node": 8}, {"constraint": "v100-32g", "partition": "gpu_p2",
                                                              "gpus_per_node": 8},
                   {"constraint": "h100|a100"}, {"time": "unlimited", "qos": "qos_site-special"}):
        slurm.render("torchrun", cluster="jean-zay", **kwargs)
    slurm.render("torchrun", time="100:00:00", constraint="h200", gpus_per_node=16)  # generic: no limits known


def test_notebook_template_refuses_several_nodes():
    with pytest.raises(ValueError, match="torchrun template"):
        slurm.render("notebook", nodes=2)


@pytest.mark.parametrize("value", ["10", "90:30", "01:00:00", "100:00:00", "2-00", "1-12:30", "1-12:30:00", 45])
def test_valid_times(value):
    assert sbatch_options(slurm.render("notebook", time=value))["--time"] == str(value)


def test_cli_prints_writes_and_fails_in_one_line(tmp_path, capsys):
    assert slurm.main(["torchrun", "--nodes", "2", "--gpus-per-node", "8", "-A", "abc"]) == 0
    opts = sbatch_options(capsys.readouterr().out)
    assert (opts["--nodes"], opts["--ntasks-per-node"], opts["--account"]) == ("2", "8", "abc")
    out = tmp_path / "sub" / "job.sbatch"
    assert slurm.main(["notebook", "--cluster", "jean-zay", "--module", "cuda/12.4",
                       "--sbatch=--mail-type=END", "-o", str(out)]) == 0
    assert "module load cuda/12.4" in out.read_text()
    capsys.readouterr()
    assert slurm.main(["torchrun", "--time", "soon"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dlo slurm: error: malformed time") and err.count("\n") == 1
    with pytest.raises(SystemExit) as exc:
        slurm.main(["torchrun", "--no-such-option"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_cluster_presets_are_described():
    assert {"generic", "jean-zay"} <= set(slurm.CLUSTERS)
    for name, preset in slurm.CLUSTERS.items():
        assert preset.name == name and preset.description


# --------------------------------------------------------------------------------------------------
# Every command the documentation shows, exercised
# --------------------------------------------------------------------------------------------------

DOCUMENTS = [paths.ROOT / "README.md", paths.ROOT / "docs" / "contributing.md", paths.ROOT / "slurm" / "README.md", paths.ROOT / "results" / "README.md",
             *sorted((paths.ROOT / "slurm").glob("*.sbatch"))]
COMMAND_WORDS = {"dlo", "python", "python3", "sbatch", "make", "bash", "mkdir"}
FAKE_SBATCH = Path(__file__).parent / "fixtures" / "fake_sbatch.py"


def _commands_in(text: str) -> list[list[str]]:
    """The commands of one shell line (split at &&, ;, ||) that start with a word this test checks."""
    try:
        tokens = shlex.split(text, comments=True)
    except ValueError:
        return []
    found, current = [], []
    for token in [*tokens, "&&"]:
        if token in ("&&", ";", "||"):
            found.append(current)
            current = []
        else:
            current.append(token)
    keep = []
    for cmd in found:
        while cmd and re.match(r"^[A-Za-z_]\w*=", cmd[0]):  # PYTHONPATH=lib python ...
            cmd = cmd[1:]
        if len(cmd) < 2 or "/" in cmd:  # a bare name, or "dlo run / check / student": names, not commands
            continue
        word = cmd[0] if cmd[0] in COMMAND_WORDS else re.sub(r"^(\.venv/bin/|\S*/bin/)", "", cmd[0])
        if word not in COMMAND_WORDS or (word.startswith("python") and cmd[1] != "-m"):
            continue
        keep.append([word, *cmd[1:]])
    return keep


def documented_commands(path: Path) -> list[tuple[int, list[str]]]:
    """(line, command) in reading order: shell code blocks (continuation lines joined) and inline code spans of
    a Markdown file; the usage examples in the header comment of a job script."""
    lines = path.read_text().splitlines()
    found: list[tuple[int, list[str]]] = []
    if path.suffix == ".sbatch":
        for n, line in enumerate(lines, 1):
            if line.startswith("#SBATCH"):
                break
            m = re.match(r"^#\s{3}(\S.*)$", line)
            if m:
                found += [(n, c) for c in _commands_in(m.group(1))]
        return found
    in_code, pending, start = False, "", 0
    for n, line in enumerate(lines, 1):
        if line.strip().startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            start = start if pending else n
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            found += [(start, c) for c in _commands_in(pending + line)]
            pending = ""
        else:
            for span in re.findall(r"`([^`\n]+)`", line):
                found += [(n, c) for c in _commands_in(span)]
    return found


def _placeholder(token: str) -> bool:
    return token == "..." or "<" in token or bool(re.fullmatch(r"[A-Z][A-Z0-9_]*", Path(token).name.split(".")[0]))


def _run_dlo(argv: list[str]) -> tuple[int, str, str]:
    """``dlo ARGV`` in this process: (exit code, stdout, stderr)."""
    import contextlib
    import io

    from dlo import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    return code, out.getvalue(), err.getvalue()


def _options_in_help(help_argv: list[str], shown: list[str], help_text: str | None = None) -> str | None:
    """None when every option of ``shown`` appears in the help of the command ``help_argv`` names."""
    if help_text is None:
        code, help_text, err = _run_dlo([*help_argv, "--help"])
        if code != 0:
            return f"--help fails: {err.strip()}"
    for token in shown:
        option = token.split("=", 1)[0]
        if option.startswith("-") and option != "--help" and \
                not re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", help_text):
            return f"{option} is not an option of `{' '.join(help_argv)}` (see its --help)"
    return None


def _check_dlo(argv: list[str]) -> str | None:
    """Run what can run without side effects, check the rest against --help. None when fine, else why not."""
    from dlo.course.checks.framework import REGISTRY

    if all(_placeholder(t) for t in argv):  # `python -m dlo ...`
        return None
    sub = argv[0]
    prefix = [sub] + [t for t in argv[1:3] if not t.startswith("-") and sub == "hpo"]
    if len(argv) == 1:  # `dlo run`, `dlo slurm`: the command named in a sentence
        return _options_in_help([sub], [])
    if any(_placeholder(t) for t in argv):
        return _options_in_help(prefix if sub != "run" else [sub, "X.ipynb"], argv)
    if sub == "run":
        code, _, err = _run_dlo([*argv, "--dry-run"])
        if code != 0 and "the following arguments are required" in err:  # `dlo run --profile auto`: an option shown
            return _options_in_help(["run", "X.ipynb"], argv)
        return None if code == 0 else err.strip()
    if sub == "slurm":
        if len(argv) > 1 and argv[1].startswith("-"):  # `dlo slurm --cluster jean-zay`: options shown
            return _options_in_help(["slurm", "TEMPLATE"], argv)
        code, _, err = _run_dlo(argv)
        return None if code == 0 else err.strip()
    if sub == "check" and len(argv) >= 3 and not argv[1].startswith("-"):
        return None if argv[2] in REGISTRY.get(argv[1], {}) else f"no checker {argv[1]} {argv[2]} (dlo check --list)"
    if sub in ("check", "student", "data"):  # parsed only: `dlo student` would rewrite the student notebooks
        from dlo.cli import build_parser

        try:
            build_parser().parse_args(argv)
        except SystemExit as exc:
            return f"dlo refuses it (exit {exc.code})"
        return None
    return _options_in_help(prefix, argv)


def _exercise(cmd: list[str], scratch: Path, bin_dir: Path, env: dict[str, str]) -> str | None:
    word = cmd[0]
    if all(t.startswith("-") or _placeholder(t) for t in cmd[1:]) and word != "sbatch":
        return None  # `bash -n`, `python -m dlo ...`: a command named with an option, not one to run
    if word == "mkdir":
        for target in (t for t in cmd[1:] if not t.startswith("-")):
            (scratch / target).mkdir(parents=True, exist_ok=True)
        return None
    if word == "dlo" or (word.startswith("python") and cmd[2] == "dlo"):
        return _check_dlo(cmd[1:] if word == "dlo" else cmd[3:])
    if word.startswith("python"):  # python -m MODULE ...: its --help shows the options
        res = subprocess.run([sys.executable, "-m", *cmd[2:], "--help"], capture_output=True, text=True, timeout=120)
        return _options_in_help(cmd[2:], cmd[3:], res.stdout) if res.returncode == 0 else res.stderr.strip()
    if word == "make":
        res = subprocess.run(["make", "-n", *cmd[1:]], cwd=paths.ROOT, capture_output=True, text=True, timeout=120)
        return None if res.returncode == 0 else res.stderr.strip()
    if word == "bash":
        script = paths.ROOT / cmd[-1]
        if not script.is_file():
            return f"no file {cmd[-1]}"
        res = subprocess.run([BASH, "-n", str(script)], capture_output=True, text=True)
        return None if res.returncode == 0 else res.stderr.strip()
    if word == "sbatch":  # the real command line, through bash, with the stand-in first on PATH
        res = subprocess.run([BASH, "-c", shlex.join(cmd)], cwd=scratch, env=env, capture_output=True, text=True,
                             timeout=300)
        return None if res.returncode == 0 else res.stderr.strip()
    return f"no check for {word}"


@pytest.fixture(scope="module")
def sbatch_cache(tmp_path_factory):
    """One cache of the stand-in sbatch for every documented command: scripts' --help texts, and the notebook dry
    runs that passed (the same submissions appear in several documents)."""
    return tmp_path_factory.mktemp("fake-sbatch-cache")


@needs_bash
@pytest.mark.parametrize("doc", DOCUMENTS, ids=lambda p: str(p.relative_to(paths.ROOT)))
def test_documented_commands_work(doc, tmp_path, monkeypatch, sbatch_cache):
    """Each command a reader may copy, run in order in a copy of the checkout without runs/ (as a fresh clone):
    files it names exist, options exist, notebook parameters exist with the right types, and every sbatch line
    would be accepted (a stand-in sbatch checks the job script, its log folder, the notebook or script and its
    arguments)."""
    from dlo.course import runner

    commands = documented_commands(doc)
    assert commands or doc.name == "README.md" and doc.parent.name == "results", f"no command found in {doc}"
    scratch = tmp_path / "checkout"
    scratch.mkdir()
    for entry in paths.ROOT.iterdir():
        if entry.name not in ("runs", ".git"):
            (scratch / entry.name).symlink_to(entry)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_SBATCH}" "$@"\n')
    (bin_dir / "sbatch").chmod(0o755)
    runs = tmp_path / "dry-runs"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "DLO_RUNS_DIR": str(runs),
           "FAKE_SBATCH_CACHE": str(sbatch_cache)}
    monkeypatch.setattr(runner, "RUNS_DIR", runs)
    monkeypatch.chdir(scratch)
    failures = []
    for line, cmd in commands:
        why = _exercise(cmd, scratch, bin_dir, env)
        if why:
            failures.append(f"{doc.relative_to(paths.ROOT)}:{line}: {shlex.join(cmd)}\n    {why}")
    assert not failures, "documented commands that do not work:\n" + "\n".join(failures)


def test_fake_sbatch_catches_what_would_fail(tmp_path):
    """The stand-in refuses a missing log folder, a wrong script path, a parameter the notebook lacks and an
    option the training script lacks (the mistakes the documentation once had)."""
    scratch = tmp_path / "checkout"
    scratch.mkdir()
    for name in ("slurm", "Jour1", "tp_fsdp", "lib", "pyproject.toml"):
        (scratch / name).symlink_to(paths.ROOT / name)

    def sbatch(*args: str) -> str:
        res = subprocess.run([sys.executable, str(FAKE_SBATCH), *args], cwd=scratch, capture_output=True, text=True,
                             timeout=300, env={**os.environ, "DLO_RUNS_DIR": str(tmp_path / "dry")})
        return res.stderr.strip() if res.returncode else "ok"

    assert "log folder runs/slurm/ does not exist" in sbatch("slurm/notebook.sbatch", "Jour1/jour1.ipynb")
    (scratch / "runs" / "slurm").mkdir(parents=True)
    assert sbatch("slurm/notebook.sbatch", "Jour1/jour1.ipynb") == "ok"
    assert "has no parameter(s) epochs" in sbatch("slurm/notebook.sbatch", "Jour1/jour1.ipynb", "-p", "epochs", "2")
    assert "tp_fsdp/train.py, which does not exist" in sbatch("slurm/torchrun.sbatch", "tp_fsdp/train.py")
    assert "has no option --profile" in sbatch("slurm/torchrun.sbatch", "tp_fsdp/fsdp_train.py", "--profile", "full")
    assert "--model takes one of" in sbatch("slurm/torchrun.sbatch", "tp_fsdp/fsdp_train.py", "--model", "gpt")
    assert "unknown sbatch option --nodez" in sbatch("--nodez", "2", "slurm/torchrun.sbatch")
