"""The multi-GPU reference figures the DDP notebooks show are read from a file, each with its source and hardware,
and the scaling computed from them agrees with what the source states."""
from __future__ import annotations

import json
import re

import dlo  # noqa: F401
from dlo.lessons.multi_gpu import REFERENCES, beside_references, reference_runs


def test_every_quoted_run_names_its_source_and_hardware():
    rows = json.loads(REFERENCES.read_text())["runs"]
    assert rows and all(r["source"] and r["hardware"] and r["gpus"] >= 1 and r["images_per_s"] > 0 for r in rows)


def test_the_computed_scaling_matches_the_stated_one():
    table = reference_runs()
    for _, r in table[table["stated_scaling"].notna()].iterrows():
        stated = float(re.search(r"\d+", r["stated_scaling"])[0]) / 100
        assert abs(r["scaling"] - stated) < 0.01, r.to_dict()


def test_measured_rows_come_first_and_are_labelled():
    table = beside_references([{"hardware": "CPU, gloo", "setting": "DDP", "gpus": 2, "images_per_s": 10.0,
                                "scaling": 0.5}])
    assert table.iloc[0]["measured or quoted"] == "measured here"
    assert all(v.startswith("reference: ") for v in table["measured or quoted"].iloc[1:])
