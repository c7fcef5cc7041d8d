"""The rules of a notebook's ``PROFILES`` table (:mod:`dlo.course.notebooks`).

``profile_differences``: the full profile has the shape of the smoke profile (what CI runs), nested dicts
included; ``profile_settings``: 'dry' is the full profile with size overrides. Every notebook's own table is held
to both, at 1, 2, 4 and 8 GPUs, by ``tests/test_full_profiles.py``."""
from __future__ import annotations

import pytest

from dlo.course.notebooks import profile_differences


def test_the_shape_rule_finds_a_missing_key_and_a_changed_kind_at_any_depth():
    smoke = dict(a=1, b=[1, 2], c=dict(x=1, y="s"), d=None, f=0.5, g=(1, 2), h=True)
    full = dict(a=[4], b=[8], c=dict(x=2), d=3, e=1, f=3, g=[1], h=1)
    assert sorted(profile_differences(smoke, full)) == [
        "a: number in smoke, list in full", "c.y: in smoke only", "e: in full only", "h: bool in smoke, number in full"]
    assert profile_differences(full, {"e": 2, "q": 1}, ("full", "dry"))[-1] == "q: in dry only"
    assert profile_differences(smoke, smoke) == []


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
