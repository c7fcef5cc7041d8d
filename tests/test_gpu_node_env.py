"""A GPU node may have torch, torchvision, transformers, pandas, matplotlib, tqdm and TensorBoard only (no DeepSpeed,
MLflow, Lightning Fabric or Accelerate): the notebooks' paths that need one of those leave it out in one line,
and the rest of the lesson still runs (``make test-compat`` rehearses the notebooks in such a Python).

Each test hides a package from this Python (``sys.modules[name] = None``, or ``importlib.util.find_spec`` answering
None): the same code then runs as on such a node, in this process, in a second or two.
"""
from __future__ import annotations

import importlib.util
import json
import math
import runpy
import sys

import re

import pytest
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
import torch

import dlo  # noqa: F401
from dlo import training as tr
from dlo.training import tracking
from dlo.runtime.paths import ROOT

FSDP_SCRIPT = ROOT / "tp_fsdp" / "fsdp_train.py"
APIS_SCRIPT = ROOT / "tp_fsdp" / "apis_train.py"


def _hide(monkeypatch, *names: str) -> None:
    """Make ``import name`` fail and ``find_spec(name)`` answer None, as where the package is not installed."""
    for name in names:
        monkeypatch.setitem(sys.modules, name, None)


def _installed(monkeypatch, name: str) -> None:
    """Make ``find_spec(name)`` answer as if ``name`` were installed (whether it is or not)."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda n, *a: importlib.util.spec_from_loader(n, loader=None) if n == name else real(n, *a))


# --------------------------------------------------------------------------------------------------
# tp_fsdp/fsdp_train.py: the DeepSpeed ZeRO runs of a launch
# --------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def fsdp_script():
    return runpy.run_path(str(FSDP_SCRIPT), run_name="fsdp_train")


RUNS = [{"name": "ddp", "strategy": "ddp"}, {"name": "zero1", "strategy": "zero1"},
        {"name": "fsdp", "strategy": "fsdp"}, {"name": "zero3", "strategy": "zero3"}]


def test_fsdp_runs_needing_deepspeed_are_left_out_with_their_reason(fsdp_script, monkeypatch):
    args = fsdp_script["parse_args"](["--runs", json.dumps(RUNS)])
    _hide(monkeypatch, "deepspeed")
    runs, skipped = fsdp_script["plan"](args)
    assert [name for name, _ in runs] == ["ddp", "fsdp"]  # the others still run, in their order
    assert [(r["run"], r["strategy"], r["status"]) for r in skipped] == [("zero1", "zero1", "skipped"),
                                                                         ("zero3", "zero3", "skipped")]
    for r in skipped:
        assert "DeepSpeed is not installed" in r["skipped"] and "pip install deepspeed==" in r["skipped"]
        assert "\n" not in r["skipped"]


def test_fsdp_runs_needing_deepspeed_run_where_it_is_installed(fsdp_script, monkeypatch):
    args = fsdp_script["parse_args"](["--runs", json.dumps(RUNS)])
    _installed(monkeypatch, "deepspeed")
    runs, skipped = fsdp_script["plan"](args)
    assert [name for name, _ in runs] == ["ddp", "zero1", "fsdp", "zero3"] and skipped == []
    assert [a.strategy for _, a in runs] == ["ddp", "zero1", "fsdp", "zero3"]


def test_a_launch_of_deepspeed_runs_only_says_why_and_records_it(fsdp_script, monkeypatch, tmp_path, capsys):
    """The launch itself: rank 0 prints one line per run left out and writes its record; nothing is built."""
    _hide(monkeypatch, "deepspeed")
    for var in ("LOCAL_RANK", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):  # what a group of one may set
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("DLO_RECORDS_DIR", str(tmp_path))
    built = []
    monkeypatch.setitem(fsdp_script["main"].__globals__, "run", lambda *a, **k: built.append(a))
    fsdp_script["main"](["--runs", json.dumps([RUNS[1], RUNS[3]])])
    lines = [line for line in capsys.readouterr().out.splitlines() if "skipped" in line]
    assert lines == [f"[{n}] skipped: {fsdp_script['why_skipped'](fsdp_script['parse_args'](['--strategy', n]))}"
                     for n in ("zero1", "zero3")]
    records = [json.loads(line) for line in (tmp_path / "rank0.jsonl").read_text().splitlines()]
    assert [(r["run"], r["status"]) for r in records] == [("zero1", "skipped"), ("zero3", "skipped")]
    assert built == []


# --------------------------------------------------------------------------------------------------
# tp_fsdp/apis_train.py and apis.ipynb: Lightning Fabric (and Accelerate) missing
# --------------------------------------------------------------------------------------------------

def test_apis_train_without_fabric_stops_in_one_line_before_any_work(monkeypatch):
    _hide(monkeypatch, "lightning_fabric")
    main = runpy.run_path(str(APIS_SCRIPT), run_name="apis_train")["main"]
    with pytest.raises(SystemExit) as exc:
        main(["--api", "fabric", "--strategy", "fsdp"])
    message = str(exc.value.code)
    assert "lightning_fabric is not installed" in message and "pip install lightning-fabric==" in message
    assert "\n" not in message


def _notebook_cell(path, cell_id: str) -> str:
    cell = next(c for c in json.loads(path.read_text())["cells"] if c.get("id") == cell_id)
    return cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])


def test_the_fabric_exercise_check_says_what_to_install_where_fabric_is_missing(monkeypatch, capsys):
    from dlo.course.checks import check
    from dlo.lessons import apis

    _hide(monkeypatch, "lightning_fabric")
    for nb in ("apis.ipynb", "student/apis.ipynb"):
        exec(_notebook_cell(ROOT / "tp_fsdp" / nb, "apis-exercise-check"),
             {"apis": apis, "fabric_loop": lambda *a: None})
        out = capsys.readouterr().out.strip()
        assert out.startswith("apis/fabric_port not checked: lightning_fabric is not installed"), out
        assert "pip install lightning-fabric==" in out and "\n" not in out
    with pytest.raises(RuntimeError, match="cannot be checked here: lightning_fabric is not installed") as exc:
        check("apis", "fabric_port", fabric_loop=lambda *a: None)  # `dlo check apis fabric_port`: one line too
    assert "\n" not in str(exc.value)


# --------------------------------------------------------------------------------------------------
# Experiment tracking (Jour3/recipes.ipynb): MLflow missing
# --------------------------------------------------------------------------------------------------

def _linear_training(tracking_dir, name):
    g = torch.Generator().manual_seed(0)
    ds = TensorDataset(torch.randn(16, 4, generator=g), torch.randint(0, 2, (16,), generator=g))
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    cfg = tr.TrainConfig(epochs=2, log_every=2, progress=False, tracking_dir=str(tracking_dir), run_name=name)
    make = lambda generator: DataLoader(ds, batch_size=4, shuffle=True, generator=generator)  # noqa: E731
    return tr.train(model, make, cfg, val_loader=DataLoader(ds, batch_size=16), track_params={"recipe": name})


def test_without_mlflow_runs_are_tracked_in_json_records_and_read_back(monkeypatch, tmp_path, capsys):
    _hide(monkeypatch, "mlflow")
    monkeypatch.setattr(tracking, "_announced", set())
    result = _linear_training(tmp_path, "base")
    with tracking.Tracker(tmp_path, {"lr": 0.1, "sizes": [1, 2], "none": None}, run_name="by-hand") as t:
        t.log({"train/loss": 2.0}, 1)
        t.log({"train/loss": 1.5, "val/accuracy": 0.25}, 2)
        t.log({"train/loss": 1.75}, 2)  # the same step again, later: the later value is the final one
        t.log({"m": math.nan}, 3)  # not finite: TensorBoard only, as with MLflow
    with pytest.raises(RuntimeError):
        with tracking.Tracker(tmp_path, {}, run_name="boom"):
            raise RuntimeError("x")
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("tracking:")]
    assert len(said) == 1 and "MLflow is not installed" in said[0] and "pip install mlflow" in said[0]
    assert not (tmp_path / "mlruns").exists() and (tmp_path / "tensorboard").is_dir()
    assert result.tracking_run_id and tracking.store_of(tmp_path) == "json"

    table = tracking.runs_table(tmp_path)
    assert list(table["run_name"]) == ["base", "by-hand", "boom"]
    assert list(table["status"]) == ["FINISHED", "FINISHED", "FAILED"]
    base, hand = table.iloc[0], table.iloc[1]
    assert base["recipe"] == "base" and base["epochs"] == 2 and base["run_id"] == result.tracking_run_id
    last_epoch = [r for r in result.records if r["event"] == "epoch"][-1]
    assert base["val/accuracy"] == pytest.approx(last_epoch["val_accuracy"]) and base["time/train_s"] > 0
    assert hand["lr"] == 0.1 and hand["sizes"] == "[1, 2]" and hand["none"] == "None"
    assert hand["train/loss"] == 1.75 and hand["val/accuracy"] == 0.25 and math.isnan(hand.get("m", math.nan))
    hist = tracking.metric_history(tmp_path, "train/loss")
    mine = hist[hist.run_name == "by-hand"]
    assert list(mine["step"]) == [1, 2, 2] and list(mine["value"]) == [2.0, 1.5, 1.75]
    losses = [r["loss"] for r in result.records if r["event"] == "train"]
    assert list(hist[hist.run_name == "base"]["value"]) == pytest.approx(losses)
    line = tracking.viewing_line(tmp_path)
    assert "MLflow is not installed" in line and "mlflow ui --backend-store-uri" in line and "\n" not in line


def test_a_store_mlflow_wrote_read_without_mlflow_is_one_line(monkeypatch, tmp_path):
    (tmp_path / "mlruns").mkdir()  # what a run tracked with MLflow leaves
    _hide(monkeypatch, "mlflow")
    with pytest.raises(FileNotFoundError, match="tracked with MLflow, and MLflow is not installed") as exc:
        tracking.runs_table(tmp_path)
    assert "pip install mlflow" in str(exc.value) and "\n" not in str(exc.value)
    with pytest.raises(FileNotFoundError, match="no tracking store"):
        tracking.metric_history(tmp_path / "elsewhere", "train/loss")


def test_a_json_run_cut_mid_line_keeps_what_it_logged_and_a_damaged_line_names_the_file(monkeypatch, tmp_path):
    _hide(monkeypatch, "mlflow")
    monkeypatch.setattr(tracking, "_announced", set())
    with tracking.Tracker(tmp_path, {"lr": 0.1}, run_name="cut") as t:
        t.log({"train/loss": 2.0}, 1)
        t.log({"train/loss": 1.5}, 2)
    path, = (tmp_path / tracking.JSON_STORE).glob("*.jsonl")
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:-1]) + '{"step": 3, "time_ms": 1, "metr')  # killed while appending
    table = tracking.runs_table(tmp_path)
    assert list(table["status"]) == ["RUNNING"] and table.iloc[0]["train/loss"] == 1.5
    assert list(tracking.metric_history(tmp_path, "train/loss")["value"]) == [2.0, 1.5]
    path.write_text(lines[0] + "garbage\n" + "".join(lines[1:]))
    with pytest.warns(tracking.BadRecord, match="line 2 is not a JSON record") as seen:
        table = tracking.runs_table(tmp_path)
    assert str(path) in str(seen[0].message) and "\n" not in str(seen[0].message)
    assert table.iloc[0]["train/loss"] == 1.5 and list(table["status"]) == ["FINISHED"]  # the other records kept


@pytest.mark.parametrize("bad_line, named", [
    ('[1, 2]', "line 2 is a JSON list, not a record"),
    ('{"step": "3", "time_ms": 1, "metrics": {"train/loss": 9.0}}', "line 2: field step is '3'"),
    ('{"step": 3, "time_ms": 1, "metrics": [9.0]}', "line 2: field metrics is [9.0]"),
    ('{"step": 3, "time_ms": 1, "metrics": {"train/loss": "9"}}', "line 2: metric train/loss is '9', not a number"),
    ('{"time_ms": 1, "metrics": {"train/loss": 9.0}}', "line 2: no field step"),
    ('{"status": 7}', "line 2: field status is 7"),
])
def test_a_json_record_of_the_wrong_shape_is_one_warning_and_every_other_row_is_kept(monkeypatch, tmp_path, bad_line,
                                                                                     named):
    _hide(monkeypatch, "mlflow")
    monkeypatch.setattr(tracking, "_announced", set())
    for name in ("a", "b"):
        with tracking.Tracker(tmp_path, {"lr": 0.1}, run_name=name) as t:
            t.log({"train/loss": 2.0}, 1)
            t.log({"train/loss": 1.5}, 2)
    path = sorted((tmp_path / tracking.JSON_STORE).glob("*.jsonl"))[0]
    lines = path.read_text().splitlines(keepends=True)
    path.write_text(lines[0] + bad_line + "\n" + "".join(lines[1:]))
    with pytest.warns(tracking.BadRecord, match=re.escape(named)):
        table = tracking.runs_table(tmp_path)
    assert sorted(table["run_name"]) == ["a", "b"] and list(table["train/loss"]) == [1.5, 1.5]
    with pytest.warns(tracking.BadRecord):
        hist = tracking.metric_history(tmp_path, "train/loss")
    assert len(hist) == 4


def test_a_run_whose_first_line_is_unusable_is_left_out_alone(monkeypatch, tmp_path):
    _hide(monkeypatch, "mlflow")
    monkeypatch.setattr(tracking, "_announced", set())
    for name in ("a", "b"):
        with tracking.Tracker(tmp_path, {"lr": 0.1}, run_name=name) as t:
            t.log({"train/loss": 2.0}, 1)
    path = sorted((tmp_path / tracking.JSON_STORE).glob("*.jsonl"))[0]
    lines = path.read_text().splitlines(keepends=True)
    path.write_text('{"run_id": 5, "run_name": "x"}\n' + "".join(lines[1:]))
    with pytest.warns(tracking.BadRecord, match="the run's first line"):
        table = tracking.runs_table(tmp_path)
    assert len(table) == 1

