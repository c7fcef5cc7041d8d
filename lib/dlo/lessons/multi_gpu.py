"""Reference figures from real multi-GPU runs, read from ``multi_gpu_references.json`` (next to this module, each
row with its source and hardware; REFERENCES.md lists them), and shown beside what a notebook measured here.

The scaling column is computed from the quoted throughputs (``images/s ÷ (GPUs × the one-GPU images/s)`` of the
same source), never typed in.
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

REFERENCES = Path(__file__).with_name("multi_gpu_references.json")


def reference_runs(path: str | Path = REFERENCES) -> pd.DataFrame:
    """The quoted runs, one row each, with ``scaling``: throughput over (GPUs × the one-GPU throughput of the same
    source and settings); empty where the source quotes no one-GPU run with the same settings."""
    rows = json.loads(Path(path).read_text(encoding="utf-8"))["runs"]
    table = pd.DataFrame(rows)
    single = {(r["source"], r["model"]): r["images_per_s"] for r in rows if r["gpus"] == 1}
    table["scaling"] = [r["images_per_s"] / (r["gpus"] * single[r["source"], r["model"]])
                        if (r["source"], r["model"]) in single else None
                        for r in rows]
    return table


def beside_references(measured: list[dict], path: str | Path = REFERENCES) -> pd.DataFrame:
    """This run's rows (``{"setting", "gpus", "images_per_s", "scaling", "hardware"}``, labelled "measured here")
    above the quoted ones (labelled "reference: <source>")."""
    ref = reference_runs(path)
    ref["measured or quoted"] = "reference: " + ref["source"]
    here = pd.DataFrame(measured)
    here["measured or quoted"] = "measured here"
    columns = ["measured or quoted", "hardware", "setting", "gpus", "images_per_s", "scaling"]
    table = pd.concat([here.reindex(columns=columns), ref.reindex(columns=columns)], ignore_index=True)
    return table.rename(columns={"gpus": "processes / GPUs", "images_per_s": "images/s"})


__all__ = ["REFERENCES", "beside_references", "reference_runs"]
