"""Slurm templates and dlo.runtime.slurm.render: valid bash, requested #SBATCH values, clear errors."""
from __future__ import annotations

import re
import shutil
import subprocess

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
])
def test_invalid_options_raise_one_line_value_error(kwargs, message):
    kwargs = dict(kwargs)
    template = kwargs.pop("template", "torchrun")
    with pytest.raises(ValueError) as err:
        slurm.render(template, **kwargs)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


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
