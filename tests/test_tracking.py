"""Experiment tracking of dlo.training (dlo.training.tracking): TensorBoard event files and a local MLflow file store are
written by train(), read back (runs_table, metric_history, TensorBoard's own reader), and a folder that
cannot be written is refused before training, in one line."""
from __future__ import annotations

import os

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dlo  # noqa: F401
from dlo.training import tracking
from dlo import training as tr


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    from dlo.measure.records import torch_threads

    with torch_threads(1):
        yield


def _setup(seed=0):
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(32, 3, 4, 4, generator=g), torch.randint(0, 2, (32,), generator=g)
    ds = TensorDataset(x, y)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Flatten(), nn.Linear(48, 2))

    def make(generator):
        return DataLoader(ds, batch_size=8, shuffle=True, generator=generator, drop_last=True)

    return model, make, DataLoader(ds, batch_size=32)


def _cfg(tmp_path, name, **kw):
    return tr.TrainConfig(epochs=2, log_every=2, progress=False, tracking_dir=str(tmp_path / "trk"), run_name=name,
                          **kw)


def test_train_writes_tensorboard_and_mlflow_and_they_read_back(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for name, lr in (("base", 0.05), ("smooth", 0.1)):
        model, make, val = _setup()
        result = tr.train(model, make, _cfg(tmp_path, name, lr=lr, label_smoothing=0.1 if name == "smooth" else 0.0),
                          val_loader=val, track_params={"model": "linear"})
        assert result.tracking_run_id
    table = tracking.runs_table(tmp_path / "trk")
    assert list(table["run_name"]) == ["base", "smooth"] and set(table["status"]) == {"FINISHED"}
    assert list(table["lr"]) == [0.05, 0.1] and list(table["label_smoothing"]) == [0.0, 0.1]
    assert list(table["model"]) == ["linear", "linear"] and list(table["epochs"]) == [2, 2]
    last = [r for r in result.records if r["event"] == "epoch"][-1]
    assert table["val/accuracy"].iloc[-1] == pytest.approx(last["val_accuracy"])
    assert (table["time/train_s"] > 0).all()
    hist = tracking.metric_history(tmp_path / "trk", "train/loss")
    assert list(hist[hist.run_name == "smooth"]["step"]) == [2, 4, 6, 8]
    losses = [r["loss"] for r in result.records if r["event"] == "train"]
    assert list(hist[hist.run_name == "smooth"]["value"]) == pytest.approx(losses)
    val_hist = tracking.metric_history(tmp_path / "trk", "val/accuracy")
    assert list(val_hist[val_hist.run_name == "base"]["step"]) == [0, 1]
    small = tracking.runs_table(tmp_path / "trk", params=["lr"])
    assert "lr" in small and "momentum" not in small

    tb = sorted((tmp_path / "trk" / "tensorboard").iterdir())
    assert [p.name.rsplit("-", 1)[0] for p in tb] == ["base", "smooth"]
    acc = EventAccumulator(str(tb[1]))
    acc.Reload()
    assert {"train/loss", "train/lr", "val/accuracy", "val/loss"} <= set(acc.Tags()["scalars"])
    assert [e.value for e in acc.Scalars("train/loss")] == pytest.approx(losses, rel=1e-6)
    hparams = acc.PluginTagToContent("hparams")  # add_hparams: the HPARAMS tab's experiment and session
    assert {"_hparams_/experiment", "_hparams_/session_start_info"} <= set(hparams)
    assert "hparam/val/accuracy" in acc.Tags()["scalars"]


def test_tracker_params_and_status(tmp_path):
    with tracking.Tracker(tmp_path / "t", {"a": 1, "b": None, "c": [1, 2]}, run_name="x") as t:
        t.log({"m": 1.5}, 0)
        t.log({"m": float("nan")}, 1)  # not finite: TensorBoard gets it, MLflow does not
    table = tracking.runs_table(tmp_path / "t")
    row = table.iloc[0]
    assert row["a"] == 1 and row["b"] == "None" and row["c"] == "[1, 2]" and row["m"] == 1.5
    with pytest.raises(RuntimeError):
        with tracking.Tracker(tmp_path / "t", {}, run_name="boom"):
            raise RuntimeError("x")
    assert list(tracking.runs_table(tmp_path / "t")["status"]) == ["FINISHED", "FAILED"]
    with pytest.raises(ValueError, match="run_name"):
        tracking.Tracker(tmp_path / "t", {}, run_name="a b/c")


def test_not_writable_tracking_dir_is_refused_before_training(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    model, make, _ = _setup()
    cfg = tr.TrainConfig(steps=1, progress=False, tracking_dir=str(blocker / "trk"))
    with pytest.raises(ValueError, match="not writable") as exc:
        tr.train(model, make, cfg)
    assert "\n" not in str(exc.value) and str(blocker / "trk") in str(exc.value)
    assert all(p.grad is None for p in model.parameters())  # refused before the first step
    with pytest.raises(ValueError, match="empty"):
        tr.TrainConfig(tracking_dir="")


def test_read_only_tracking_dir(as_unprivileged, read_only_folder):
    ro, rw = read_only_folder

    def attempt(folder):
        def fn():
            try:
                tracking.check_writable(folder / "sub")
            except ValueError as exc:
                return str(exc)
            return None
        return as_unprivileged(fn)

    message = attempt(ro)
    assert message is not None and "not writable" in message
    assert attempt(rw) is None  # the control: the same user may write a writable folder


def test_runs_table_without_a_store(tmp_path):
    with pytest.raises(FileNotFoundError, match="tracking_dir"):
        tracking.runs_table(tmp_path / "nothing")


def test_tracking_off_by_default(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DLO_TRACKING_DIR", raising=False)
    model, make, _ = _setup()
    result = tr.train(model, make, tr.TrainConfig(steps=2, progress=False))
    assert result.tracking_run_id is None and list(tmp_path.iterdir()) == []


def test_dlo_tracking_dir_turns_tracking_on_for_every_run(tmp_path, monkeypatch):
    """A batch job exports DLO_TRACKING_DIR once; every train() call without its own tracking_dir logs there."""
    monkeypatch.setenv("DLO_TRACKING_DIR", str(tmp_path / "env-trk"))
    model, make, _ = _setup()
    result = tr.train(model, make, tr.TrainConfig(steps=2, progress=False, run_name="from-env"))
    assert result.tracking_run_id
    assert list(tracking.runs_table(tmp_path / "env-trk")["run_name"]) == ["from-env"]
    model, make, _ = _setup()  # an explicit tracking_dir still wins
    tr.train(model, make, tr.TrainConfig(steps=2, progress=False, tracking_dir=str(tmp_path / "own"), run_name="own"))
    assert list(tracking.runs_table(tmp_path / "own")["run_name"]) == ["own"]
    assert len(tracking.runs_table(tmp_path / "env-trk")) == 1
