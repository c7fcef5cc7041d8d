"""requirements.txt (pip) and environment.yml (conda) name the same packages at the same exact versions."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
REQUIREMENTS = ROOT / "requirements.txt"
ENVIRONMENT = ROOT / "environment.yml"

# Deliberate differences between the two files, by normalised name, each with its reason. None today:
# DeepSpeed builds with pip's default build isolation (see environment.yml), so it is pinned in both.
ONLY_IN_REQUIREMENTS: dict[str, str] = {}
ONLY_IN_ENVIRONMENT: dict[str, str] = {}
# Conda packages that are the environment itself rather than workbook dependencies.
CONDA_BASE = {"python", "pip"}

_PIN = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(?:\[(?P<extras>[^\]]*)\])?\s*(?P<op>===|==|~=|!=|>=|<=|>|<|=)?\s*(?P<version>[^\s;#]*)")


def normalise(name: str) -> str:
    """PEP 503: case and runs of -_. do not matter (``Ray`` == ``ray``, ``py_cpuinfo`` == ``py-cpuinfo``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_pin(line: str, where: str) -> tuple[str, tuple[str, ...], str, str]:
    """``ray[tune]==2.60.0`` -> (``ray``, (``tune``,), ``==``, ``2.60.0``)."""
    m = _PIN.match(line.strip())
    assert m, f"{where}: cannot parse {line!r}"
    extras = tuple(sorted(e.strip() for e in (m["extras"] or "").split(",") if e.strip()))
    return normalise(m["name"]), extras, m["op"] or "", m["version"]


def requirement_lines(text: str) -> list[str]:
    out = []
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        assert not line.startswith("-"), f"requirements.txt: pip option {line!r} has no environment.yml counterpart"
        out.append(line)
    return out


def read_requirements() -> dict[str, tuple[tuple[str, ...], str, str]]:
    pins: dict[str, tuple[tuple[str, ...], str, str]] = {}
    for line in requirement_lines(REQUIREMENTS.read_text()):
        name, extras, op, version = parse_pin(line, "requirements.txt")
        assert name not in pins, f"requirements.txt: {name} is pinned twice"
        pins[name] = (extras, op, version)
    return pins


def read_environment() -> tuple[dict, dict[str, tuple[tuple[str, ...], str, str]], dict[str, str]]:
    """(the YAML document, pip pins, conda packages -> version spec)."""
    doc = yaml.safe_load(ENVIRONMENT.read_text())
    assert isinstance(doc, dict), "environment.yml: not a mapping"
    pins: dict[str, tuple[tuple[str, ...], str, str]] = {}
    conda: dict[str, str] = {}
    for dep in doc.get("dependencies") or []:
        if isinstance(dep, dict):
            assert set(dep) == {"pip"}, f"environment.yml: unexpected section {sorted(dep)}"
            for line in dep["pip"] or []:
                name, extras, op, version = parse_pin(str(line), "environment.yml (pip)")
                assert name not in pins, f"environment.yml: {name} is pinned twice"
                pins[name] = (extras, op, version)
            continue
        spec = str(dep).split("::")[-1].strip()  # drop a channel prefix
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*(.*)$", spec)
        assert m, f"environment.yml: cannot parse {dep!r}"
        name, rest = normalise(m[1]), m[2].strip()
        if name in CONDA_BASE:
            conda[name] = rest
            continue
        # A conda package standing for a pip pin: "name=1.2.3" or "name==1.2.3" (conda's = is a prefix match
        # only with a trailing .*; an exact version is written name==1.2.3 or name=1.2.3 with all parts).
        vm = re.match(r"^(==|=)\s*([^\s=*]+)$", rest)
        assert vm, f"environment.yml: {dep!r} is not pinned to an exact version (name==X.Y.Z)"
        assert name not in pins, f"environment.yml: {name} is pinned twice"
        pins[name] = ((), "==", vm[2])
    return doc, pins, conda


def test_requirements_parser_handles_comments_and_extras():
    text = "# comment\n\ntorch==2.13.0  # trailing\nRay[tune, default]==2.60.0\nPy_CPUInfo==9.0.0\n"
    parsed = [parse_pin(line, "t") for line in requirement_lines(text)]
    assert parsed == [("torch", (), "==", "2.13.0"), ("ray", ("default", "tune"), "==", "2.60.0"),
                      ("py-cpuinfo", (), "==", "9.0.0")]


def test_every_requirement_is_pinned_exactly():
    pins = read_requirements()
    assert pins, "requirements.txt names no package"
    loose = {name: op + version for name, (_, op, version) in pins.items() if op != "==" or not version}
    assert not loose, f"requirements.txt: pin these exactly with ==: {loose}"
    wildcard = {name: version for name, (_, _, version) in pins.items() if "*" in version}
    assert not wildcard, f"requirements.txt: no wildcards in pins: {wildcard}"


@pytest.mark.parametrize("name", ["torch", "torchvision"])
def test_torch_and_torchvision_are_pinned_with_double_equals(name):
    line = next((line for line in requirement_lines(REQUIREMENTS.read_text())
                 if parse_pin(line, "requirements.txt")[0] == name), None)
    assert line is not None, f"requirements.txt does not pin {name}"
    assert re.fullmatch(rf"{name}==\d+(\.\d+)*", line.replace(" ", "")), (
        f"requirements.txt: {line!r}: pin {name} as {name}==X.Y.Z (a looser pin pulls the newest CUDA build)")
    _, env_pins, _ = read_environment()
    assert env_pins.get(name, ((), "", ""))[1:] == ("==", read_requirements()[name][2]), (
        f"environment.yml: pin {name}=={read_requirements()[name][2]} like requirements.txt")


def test_environment_yml_is_a_named_conda_env_with_python_311_and_pip():
    doc, pins, conda = read_environment()
    assert doc.get("name") == "dlo", "environment.yml: the env must be named dlo (the Slurm docs use that name)"
    assert conda.get("python", "").lstrip("=") in ("3.11", "3.11.*"), "environment.yml: python=3.11"
    assert "pip" in conda, "environment.yml: list pip (the pip: section needs it)"
    loose = {name: op + version for name, (_, op, version) in pins.items() if op != "==" or not version}
    assert not loose, f"environment.yml: pin these exactly with ==: {loose}"


def test_same_packages_and_versions_in_both_files():
    req = read_requirements()
    _, env, _ = read_environment()
    missing = sorted(set(req) - set(env) - set(ONLY_IN_REQUIREMENTS))
    extra = sorted(set(env) - set(req) - set(ONLY_IN_ENVIRONMENT))
    assert not missing, f"in requirements.txt but not environment.yml: {missing} (add them with the same pin)"
    assert not extra, f"in environment.yml but not requirements.txt: {extra} (add them there, or remove them)"
    stale = sorted(set(ONLY_IN_REQUIREMENTS) & set(env)) + sorted(set(ONLY_IN_ENVIRONMENT) & set(req))
    assert not stale, f"listed as exceptions but present in both files: {stale} (drop them from the test's lists)"
    differ = {name: (req[name][1] + req[name][2], env[name][1] + env[name][2])
              for name in set(req) & set(env) if req[name][1:] != env[name][1:]}
    assert not differ, f"versions differ (requirements.txt, environment.yml): {differ}"
    extras = {name: (req[name][0], env[name][0]) for name in set(req) & set(env) if req[name][0] != env[name][0]}
    assert not extras, f"extras differ (requirements.txt, environment.yml): {extras}"
