"""Sentences about measured outcomes are written from the measurements, in every notebook.

A notebook that states a measured outcome ("X is faster", "no measurable difference", "costs almost nothing")
writes it with ``dlo.measure.conclude``, which records the sentence with the numbers behind it in the
notebook's results.json; here every recorded sentence is written again from its numbers
(``check_conclusions``). The results are those of the notebooks' runs: ``runs/`` (``make run``, ``dlo run``)
and ``$DLO_RUNS_DIR`` (``make test`` runs the notebooks with nbval there). Synthetic results pin the two
contradictions that motivated it: "no difference" said of 15.0 vs 53.8 img/s, and "costs almost nothing per
step" said of epochs of 28.2 s vs 3.9 s.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import dlo  # noqa: F401  (before torchvision: prepares its import)
from dlo.measure import Measurement, check_conclusions, compare_sentence, conclude, load_json, save_json
from dlo.lessons.epoch_timing import epoch_measurement
from dlo.runtime import paths

ROOT = paths.ROOT
#: Notebooks that state measured outcomes through conclude() and check them before saving results.json.
CONCLUDING = ["Jour1/jour1.ipynb", "Jour1/shapes.ipynb", "Jour2/augment.ipynb", "Jour2/dataloader.ipynb", "Jour2/ddp.ipynb", "Jour3/recipes.ipynb",
              "Jour4/inference.ipynb",
              "Jour2/dp_scratch.ipynb",
              "tp_tensor_parallel/tensor_parallel.ipynb",
              "Jour3/transfer.ipynb", "Jour3/jit.ipynb", "Jour3/optimizers.ipynb", "tp_fsdp/fsdp.ipynb",
              "tp_tensor_parallel/attention.ipynb", "tp_pipeline/grid.ipynb", "tp_fsdp/apis.ipynb", "tp_pipeline/pipeline.ipynb"]


def _results_files() -> list[Path]:
    roots = {ROOT / "runs", Path(os.environ.get("DLO_RUNS_DIR", ROOT / "runs"))}
    found = set()
    for root in roots:
        if root.is_dir():
            found.update(root.glob("**/results.json"))
    out = []
    for path in sorted(found):
        try:
            if "conclusions" in json.loads(path.read_text()):
                out.append(path)
        except FileNotFoundError:  # removed since the search (another run cleaning up)
            continue
        except (OSError, ValueError):  # truncated or unreadable: it may hold conclusions; the test says which file
            out.append(path)
    return out


@pytest.mark.parametrize("path", _results_files() or [None], ids=str)
def test_every_recorded_conclusion_matches_its_numbers(path):
    """Every notebook's results.json (any notebook that recorded conclusions): each sentence, written again
    from the numbers recorded with it, is the sentence the notebook showed."""
    if path is None:
        pytest.skip("no results.json with conclusions under runs/ or $DLO_RUNS_DIR yet: run a notebook first")
    results = load_json(path)  # a file that is not JSON (a run killed while writing it) fails here, naming it
    assert results["conclusions"], f"{path}: an empty list of conclusions"
    if not any("rule" in c for c in results["conclusions"]):
        pytest.skip(f"{path} was written before the decision rule of dlo.measure.decide: run its notebook again")
    assert check_conclusions(results) == []


def test_a_truncated_results_json_fails_naming_it_instead_of_being_skipped(tmp_path, monkeypatch):
    """A results.json cut short (a run killed while writing it) may have held conclusions: it is checked, and the
    check fails with its name, rather than being left out (and the test skipped when it was the only one)."""
    good = {"conclusions": [{"kind": "compare", "sentence": "x"}]}
    (tmp_path / "whole").mkdir()
    (tmp_path / "whole" / "results.json").write_text(json.dumps(good))
    (tmp_path / "cut").mkdir()
    (tmp_path / "cut" / "results.json").write_text(json.dumps(good)[:25])
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "results.json").write_text(json.dumps({"rows": []}))
    monkeypatch.setenv("DLO_RUNS_DIR", str(tmp_path))
    found = _results_files()
    assert tmp_path / "cut" / "results.json" in found and tmp_path / "whole" / "results.json" in found
    assert tmp_path / "other" / "results.json" not in found  # whole, without conclusions: nothing to check
    with pytest.raises(ValueError) as err:
        test_every_recorded_conclusion_matches_its_numbers(tmp_path / "cut" / "results.json")
    assert str(tmp_path / "cut" / "results.json") in str(err.value) and "\n" not in str(err.value)


def tight(name, seconds, items=8):
    """A steady measurement of ``seconds`` per call with a narrow noise band."""
    return Measurement(name=name, times_s=[seconds * f for f in (0.99, 1.0, 1.0, 1.01, 1.0, 0.99, 1.01, 1.0)],
                       items_per_call=items, steady=True)


def test_no_difference_said_of_15_vs_53_8_img_s_is_caught(tmp_path):
    fast, slow = tight("no .item()", 8 / 53.8), tight(".item() every step", 8 / 15.0)
    results = {"conclusions": [{"kind": "compare", "a": fast.to_record(), "b": slow.to_record(), "args": {},
                                "sentence": "no .item() against .item() every step: no measurable difference on "
                                            "this machine"}]}
    loaded = load_json(save_json(results, tmp_path / "results.json"))
    problems = check_conclusions(loaded)
    assert len(problems) == 1 and "3.6x faster" in problems[0]


def _epochs(seconds):
    return [{"event": "epoch", "epoch": i, "seconds": s} for i, s in enumerate(seconds)]


def test_costs_almost_nothing_said_of_28_2_vs_3_9_s_epochs_is_caught(tmp_path):
    """Jour 2's augment notebook once said mixing "costs almost nothing per step" while its epochs took
    28.2 s with mixing and 3.9 s without."""
    images = 1024
    mixing = epoch_measurement("MixUp/CutMix", _epochs([31.0, 28.2, 28.0, 28.4, 28.1, 28.3, 28.2, 28.5, 28.0]), images)
    plain = epoch_measurement("no mixing", _epochs([6.0, 3.9, 3.95, 3.85, 3.9, 3.92, 3.88, 3.9, 3.91]), images)
    # three epochs a side cannot decide anything at a 1 % false-positive rate, whatever the gap: said so
    assert "too few" in compare_sentence(epoch_measurement("m", _epochs([31.0, 28.2, 28.0, 28.4]), images),
                                         epoch_measurement("p", _epochs([6.0, 3.9, 3.95, 3.85]), images))
    said = compare_sentence(mixing, plain, a_label="An epoch with MixUp/CutMix", b_label="an epoch without mixing")
    assert said.startswith("An epoch with MixUp/CutMix is slower than an epoch without mixing on this machine: 0.14x")
    old = {"conclusions": [{"kind": "compare", "a": mixing.to_record(), "b": plain.to_record(),
                            "args": {"a_label": "An epoch with MixUp/CutMix", "b_label": "an epoch without mixing"},
                            "sentence": "MixUp/CutMix costs almost nothing per step."}]}
    problems = check_conclusions(load_json(save_json(old, tmp_path / "results.json")))
    assert len(problems) == 1 and "0.14x its throughput" in problems[0]
    fresh = {}
    conclude(fresh, mixing, plain, a_label="An epoch with MixUp/CutMix", b_label="an epoch without mixing")
    assert check_conclusions(load_json(save_json(fresh, tmp_path / "fresh.json"))) == []


def test_epochs_within_the_noise_give_a_hedged_sentence():
    a = epoch_measurement("A", _epochs([9.0, 4.0, 4.4, 3.8, 4.2, 4.6, 3.7, 4.3, 3.9]), 512)
    b = epoch_measurement("B", _epochs([9.0, 4.1, 4.3, 3.9, 4.0, 4.0, 4.2, 4.1, 4.0]), 512)
    said = compare_sentence(a, b)
    assert "A against B: undecided on this machine" in said and said.endswith("so no ratio is given.")
    same = epoch_measurement("A", _epochs([9.0, 4.0, 4.04, 3.98, 4.02, 4.01, 4.0, 4.03, 3.99]), 512)
    steady_b = epoch_measurement("B", _epochs([9.0, 4.01, 4.03, 3.99, 4.0, 4.02, 4.01, 4.0, 4.02]), 512)
    assert "no measurable difference on this machine" in compare_sentence(same, steady_b)


def test_epoch_measurement_leaves_the_first_epoch_out_and_needs_two_timed_epochs():
    m = epoch_measurement("run", _epochs([9.0, 4.0, 4.2]), 100)
    assert m.times_s == [4.0, 4.2] and m.warmup_times_s == [9.0] and m.warmup == 1 and m.steady is None
    one = epoch_measurement("short", _epochs([9.0, 4.0]), 100)
    assert one.steady is False  # one timed epoch has no spread: no ratio will be written from it
    assert compare_sentence(one, m).startswith("No ratio reported")
    with pytest.raises(ValueError, match="nothing left to time"):
        epoch_measurement("none", _epochs([9.0]), 100)
    with pytest.raises(ValueError, match="items_per_epoch must be a positive integer"):
        epoch_measurement("bad", _epochs([9.0, 1.0]), 0)


@pytest.mark.parametrize("notebook", CONCLUDING)
def test_notebooks_state_measured_outcomes_through_conclude_and_check_them(notebook):
    nb = json.loads((ROOT / notebook).read_text())
    code = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    assert "conclude(results," in code
    assert code.index("check_conclusions(results)") < code.index("save_json(results")


@pytest.mark.parametrize("notebook, sentence", [
    ("Jour2/augment.ipynb", "costs almost nothing per step"),
    ("Jour2/dataloader.ipynb", "decoding and flipping them costs almost nothing"),
    ("Jour2/dataloader.ipynb", "so the saving is small"),
    ("Jour3/recipes.ipynb", "It costs nothing per step"),
    ("Jour3/recipes.ipynb", "buy **accuracy** at (almost) no training cost"),
    ("Jour3/transfer.ipynb", "the frozen variant costs a fraction of a full step"),
])
def test_typed_claims_about_measured_outcomes_are_gone(notebook, sentence):
    nb = json.loads((ROOT / notebook).read_text())
    assert sentence not in "\n".join("".join(c["source"]) for c in nb["cells"])
