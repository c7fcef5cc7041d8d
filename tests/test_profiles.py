"""Every notebook's ``full`` profile has the shape of its ``smoke`` profile: the same keys, nested dicts
included, and values of the same kind. CI runs the smoke profile only, so a key that only ``full`` lacks (a
KeyError on a GPU node, hours into a job) or a list where smoke has a number would otherwise first show on
a GPU. Read from the notebooks' ``PROFILES = {...}`` cells without running them."""
from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from dlo.course.notebooks import source_notebooks

NOTEBOOKS = source_notebooks()
#: Differences that are the point, with the reason.
EXPECTED = {("hpo.ipynb", "ray_resources.gpu: in full only"): "a Ray resource request: a GPU share only on a GPU node"}


def _profiles(path: Path) -> dict[str, ast.expr]:
    for cell in json.loads(path.read_text())["cells"]:
        src = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
        if cell["cell_type"] != "code" or "PROFILES = {" not in src:
            continue
        for node in ast.parse(src).body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "PROFILES" for t in node.targets):
                assert isinstance(node.value, ast.Dict), f"{path.name}: PROFILES must be a dict literal"
                return {ast.literal_eval(k): v for k, v in zip(node.value.keys, node.value.values)}
    raise AssertionError(f"{path.name}: no PROFILES = {{...}} cell")


def _fields(node: ast.expr) -> dict[str, ast.expr] | None:
    if isinstance(node, ast.Dict) and all(isinstance(k, ast.Constant) for k in node.keys):
        return {k.value: v for k, v in zip(node.keys, node.values)}
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "dict" and not node.args:
        return {kw.arg: kw.value for kw in node.keywords}
    return None


def _kind(node: ast.expr) -> str:
    """"number", "str", "bool", "list", "dict", or "any" (None or an expression computed at run time)."""
    if isinstance(node, ast.Constant):
        if node.value is None:
            return "any"
        if isinstance(node.value, bool):
            return "bool"
        return "number" if isinstance(node.value, (int, float)) else type(node.value).__name__
    if isinstance(node, ast.UnaryOp) and isinstance(node.operand, ast.Constant):
        return "number"
    if isinstance(node, (ast.List, ast.Tuple)):
        return "list"
    if _fields(node) is not None:
        return "dict"
    return "any"


def _differences(smoke: ast.expr, full: ast.expr, where: str) -> list[str]:
    fs, ff = _fields(smoke), _fields(full)
    if fs is not None and ff is not None:
        out = [f"{where}{k}: in smoke only" for k in fs.keys() - ff.keys()]
        out += [f"{where}{k}: in full only" for k in ff.keys() - fs.keys()]
        for k in fs.keys() & ff.keys():
            out += _differences(fs[k], ff[k], f"{where}{k}.")
        return out
    ks, kf = _kind(smoke), _kind(full)
    if "any" in (ks, kf) or ks == kf:
        return []
    return [f"{where.rstrip('.')}: {ks} in smoke, {kf} in full"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_full_profile_has_the_shape_of_the_smoke_profile(path):
    profiles = _profiles(path)
    assert {"smoke", "full"} <= profiles.keys(), f"{path.name}: PROFILES needs 'smoke' and 'full'"
    found = _differences(profiles["smoke"], profiles["full"], "")
    assert [d for d in found if (path.name, d) not in EXPECTED] == []


def test_the_check_finds_a_missing_key_and_a_changed_kind():
    smoke = ast.parse('dict(a=1, b=[1, 2], c=dict(x=1, y="s"), d=None)', mode="eval").body
    full = ast.parse('dict(a=[4], b=[8], c=dict(x=2), d=3, e=1)', mode="eval").body
    assert sorted(_differences(smoke, full, "")) == ["a: number in smoke, list in full", "c.y: in smoke only",
                                                      "e: in full only"]


DRY = [p for p in NOTEBOOKS if "dry" in _profiles(p)]


@pytest.mark.parametrize("path", DRY, ids=[p.name for p in DRY])
def test_the_dry_profile_overrides_only_what_the_full_profile_has(path):
    """'dry' rehearses the full profile on a CPU: its entry only overrides full settings (a key full lacks is a
    typo that rehearses nothing), with values of the same kind."""
    profiles = _profiles(path)
    dry, full = _fields(profiles["dry"]), _fields(profiles["full"])
    assert dry is not None and full is not None, f"{path.name}: PROFILES['dry'] and ['full'] must be dict(...) literals"
    assert sorted(dry.keys() - full.keys()) == [], f"{path.name}: 'dry' overrides keys the full profile does not have"
    assert [d for k in dry for d in _differences(full[k], dry[k], f"{k}.")] == []


def test_profile_settings_merges_the_dry_overrides_into_the_full_profile():
    from dlo.course.notebooks import is_full, profile_settings

    table = {"smoke": {"n": 8, "sizes": [1]}, "full": {"n": 4096, "sizes": [1, 2, 4]}, "dry": {"n": 16}}
    assert profile_settings(table, "dry") == {"n": 16, "sizes": [1, 2, 4]}
    assert profile_settings(table, "smoke") == {"n": 8, "sizes": [1]}
    got = profile_settings(table, "full")
    got["n"] = 0
    assert table["full"]["n"] == 4096  # a copy: a notebook's edits do not leak into its table
    assert is_full("dry") and is_full("full") and not is_full("smoke")
    with pytest.raises(ValueError, match="overrides typo, which the full profile does not have"):
        profile_settings({**table, "dry": {"typo": 1}}, "dry")
    with pytest.raises(ValueError, match="has no 'dry' profile"):
        profile_settings({"smoke": {}, "full": {}}, "dry")
