"""`make lab` and the kernel `make install` registers: `dlo` is found in JupyterLab's terminals and by `!dlo ...` in
a notebook, even when the Jupyter that starts the kernel has no venv on its PATH (a JupyterHub)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from dlo.runtime.paths import ROOT

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
VENV_BIN = str(ROOT / ".venv" / "bin")


def _make_n(target: str) -> list[str]:
    res = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "MFLAGS"))})
    assert res.returncode == 0, res.stderr
    return res.stdout.replace("\\\n", " ").splitlines()


def _kernel_install(target: str) -> str:
    lines = [line for line in _make_n(target) if "-m ipykernel install" in line]
    assert len(lines) == 1, lines
    return lines[0]


def test_make_lab_puts_the_venv_bin_first_on_path():
    lines = _make_n("lab")
    lab = [line for line in lines if "jupyter lab" in line]
    assert len(lab) == 1, lines
    assert lab[0].startswith(f"PATH='{VENV_BIN}':\"$PATH\" "), lab[0]
    # the kernel is registered (again) before, with its PATH
    assert lines.index(_kernel_install("lab")) < lines.index(lab[0])


def test_make_lab_terminal_finds_dlo():
    """What a terminal opened in the lab inherits: the recipe's PATH, with a PATH that has no venv on it."""
    lab = next(line for line in _make_n("lab") if "jupyter lab" in line)
    command = lab.replace(".venv/bin/jupyter lab", "command -v dlo")
    res = subprocess.run(["bash", "-c", command], cwd=ROOT, capture_output=True, text=True, timeout=30,
                         env={**os.environ, "PATH": "/usr/bin:/bin"})
    assert res.returncode == 0 and res.stdout.strip() == f"{VENV_BIN}/dlo", (res.stdout, res.stderr)


def test_installed_kernel_runs_dlo_from_a_notebook(tmp_path):
    """`make install`'s registration, into a scratch prefix; the kernel started from a PATH without the venv."""
    command = _kernel_install("install")
    assert f"--env PATH '{VENV_BIN}:${{PATH}}'" in command, command
    assert "--sys-prefix" in command
    subprocess.run(["bash", "-c", command.replace("--sys-prefix", f"--prefix '{tmp_path}'")], cwd=ROOT, check=True,
                   timeout=120)
    spec_dir = tmp_path / "share" / "jupyter" / "kernels" / "dlo"
    spec = json.loads((spec_dir / "kernel.json").read_text())
    assert spec["env"] == {"PATH": f"{VENV_BIN}:${{PATH}}"} and spec["display_name"] == "Python (dlo)"

    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    ksm = KernelSpecManager(kernel_dirs=[str(spec_dir.parent)], ensure_native_kernel=False)
    km = KernelManager(kernel_name="dlo", kernel_spec_manager=ksm)
    km.start_kernel(env={**os.environ, "PATH": "/usr/bin:/bin"}, cwd=str(tmp_path))
    try:
        kc = km.client()
        kc.start_channels()
        kc.wait_for_ready(timeout=120)
        out: list[str] = []

        def hook(msg):
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])

        reply = kc.execute_interactive("!command -v dlo\nimport os; print(os.environ['PATH'])", timeout=120,
                                       output_hook=hook)
        kc.stop_channels()
    finally:
        km.shutdown_kernel(now=True)
    assert reply["content"]["status"] == "ok", reply["content"]
    found, path = "".join(out).split()
    assert found == f"{VENV_BIN}/dlo" and Path(found).is_file()
    assert path == f"{VENV_BIN}:/usr/bin:/bin"
