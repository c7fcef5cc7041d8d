"""Progress in batch logs: tqdm bars as text lines at a bounded rate, the training loop's lines, the log filter
(colour codes, redraws), and what `dlo run` writes with both engines for a notebook with a bar, a redrawn bar in
colour and a silent cell."""
from __future__ import annotations

import io
import os
import re
import subprocess
import sys

import pytest

from dlo.course import runner
from dlo.runtime import progress
from dlo.runtime.paths import ROOT

FIXTURE = ROOT / "tests" / "fixtures" / "progress.ipynb"


@pytest.fixture
def text_bars(monkeypatch):
    def install(interval: float):
        monkeypatch.setenv(progress.INTERVAL_ENV, str(interval))
        undo = progress.install()
        return undo

    undos = []
    yield lambda interval: undos.append(install(interval))
    for undo in undos:
        undo()


def test_text_bar_writes_its_start_and_final_state_only_within_one_interval(text_bars):
    text_bars(10**9)
    from tqdm.auto import tqdm

    out = io.StringIO()
    bar = tqdm(total=50, desc="draws", file=out, leave=False)
    for i in range(50):
        bar.update(1)
        bar.set_postfix(loss=i)  # a refresh each time, as the training loop does every log_every steps
    bar.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and lines[0].startswith("draws:   0%") and "50/50" in lines[1], lines
    assert "\r" not in out.getvalue() and "\x1b" not in out.getvalue()


def test_text_bar_with_no_interval_writes_each_state_once(text_bars):
    text_bars(0)
    from tqdm.auto import tqdm, trange

    out = io.StringIO()
    for _ in tqdm(range(4), desc="d", file=out, mininterval=0, miniters=1):
        pass
    lines = out.getvalue().splitlines()
    assert [re.search(r"\d/4", ln).group() for ln in lines] == ["0/4", "1/4", "2/4", "3/4", "4/4"], lines
    assert trange(3).__class__ is progress.text_bar_class()


def test_install_is_undone(text_bars):
    import tqdm.auto

    before = tqdm.auto.tqdm
    undo = progress.install()
    assert tqdm.auto.tqdm is progress.text_bar_class() and progress.text_mode()
    undo()
    assert tqdm.auto.tqdm is before


def test_heartbeat_is_rate_bounded():
    now = [0.0]
    out = io.StringIO()
    hb = progress.Heartbeat(every_s=30, out=out, clock=lambda: now[0])
    beats = []
    for second in range(0, 100):  # a step per second for 100 s: a line at 30, 60 and 90 s
        now[0] = float(second)
        beats.append(hb.beat(lambda: f"step {second}"))
    assert out.getvalue().splitlines() == ["step 30", "step 60", "step 90"] and sum(beats) == 3


def test_line_filter_turns_redraws_into_lines_at_a_bounded_rate_without_colours():
    now = [0.0]
    out = io.StringIO()
    lf = runner.LineFilter(out, every_s=10, clock=lambda: now[0])
    for i in range(1, 31):  # a redraw every second for 30 s
        now[0] = float(i)
        lf.write(f"\r\x1b[32mbar {i}/30\x1b[0m")
    lf.write("\n\x1b[1;31mred\x1b[0m words\n")
    assert out.getvalue().splitlines() == ["bar 1/30", "bar 11/30", "bar 21/30", "bar 30/30", "red words"]


def test_the_training_loop_logs_epochs_and_a_heartbeat_whatever_log_every(monkeypatch, capsys):
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from dlo.training import TrainConfig, train

    monkeypatch.setenv(progress.ENV, "text")
    monkeypatch.setenv(progress.INTERVAL_ENV, "0")  # a heartbeat line at every step
    data = TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,)))
    cfg = TrainConfig(epochs=2, lr=0.1, log_every=10**9, progress=False, schedule=None, optimizer="sgd")
    result = train(nn.Linear(4, 2), lambda g: DataLoader(data, batch_size=8, shuffle=True, generator=g), cfg,
                   val_loader=DataLoader(data, batch_size=16))
    lines = capsys.readouterr().out.splitlines()
    assert result.step == 8
    beats = [re.fullmatch(r"train: step (\d+)/8 \(epoch (\d+)\), \d+ s", ln) for ln in lines
             if ln.startswith("train: step")]
    assert [(int(m[1]), int(m[2])) for m in beats] == [(s, (s - 1) // 4 + 1) for s in range(1, 9)]
    epochs = [ln for ln in lines if ln.startswith("train: epoch")]
    assert [ln.split(",")[0] for ln in epochs] == ["train: epoch 1/2 at step 4/8", "train: epoch 2/2 at step 8/8"]
    assert all("val accuracy" in ln for ln in epochs)


def test_the_training_loop_is_quiet_outside_a_log(monkeypatch, capsys):
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from dlo.training import TrainConfig, train

    monkeypatch.delenv(progress.ENV, raising=False)
    data = TensorDataset(torch.randn(16, 4), torch.randint(0, 2, (16,)))
    train(nn.Linear(4, 2), lambda g: DataLoader(data, batch_size=8, generator=g),
          TrainConfig(epochs=1, lr=0.1, progress=False, schedule=None, optimizer="sgd"))
    assert "train:" not in capsys.readouterr().out


def _elapsed_s(line: str) -> int:
    m = re.search(r"\[(\d+):(\d+)<", line)
    return int(m.group(1)) * 60 + int(m.group(2))


@pytest.mark.parametrize("engine", [pytest.param("papermill", marks=pytest.mark.notebook), "plain"])
def test_dlo_run_streams_progress_lines_into_a_log(tmp_path, engine):
    interval, steps = 0.5, 30
    res = subprocess.run([sys.executable, "-m", "dlo", "run", str(FIXTURE), "--profile", "smoke", "--engine", engine,
                          "--out-dir", str(tmp_path), "-p", "steps", str(steps), "-p", "pause", "0.1",
                          "-p", "silent_s", "1.5"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={**os.environ, progress.INTERVAL_ENV: str(interval)})
    assert res.returncode == 0, res.stderr
    log = res.stdout
    assert "\x1b" not in log and "\r" not in log
    lines = log.splitlines()
    # the tqdm bar: its start, lines between, its final state; one line per interval at most, not one per update
    bar = [ln for ln in lines if ln.startswith("work:")]
    assert bar[0].startswith("work:   0%") and f"{steps}/{steps}" in bar[-1], bar
    assert 3 <= len(bar) <= _elapsed_s(bar[-1]) / interval + 3 and len(bar) < steps / 2, bar
    # the bar redrawn with \r in colour: plain lines, as many at most
    redraws = [ln for ln in lines if ln.startswith("redraw ")]
    assert redraws[0] == f"redraw 1/{steps}" and redraws[-1] == f"redraw {steps}/{steps}", redraws
    assert 3 <= len(redraws) < steps / 2, redraws
    assert "coloured words" in lines
    # the silent cell (1.5 s, silence reported after 2 intervals = 1 s) says it is still running
    last = next(i for i, ln in enumerate(lines) if ln.startswith("--- code cell 4/4 ("))
    assert lines[last + 1].startswith("--- code cell 4/4 still running"), lines[last:]
    assert lines[last + 2] == "done"


def test_the_text_bar_pickles_by_reference_so_ray_can_ship_code_that_uses_it():
    """A Ray trainable that uses a bar is pickled with the bar's class: by name, not by value with tqdm's
    class-level multiprocessing lock (which cannot be pickled)."""
    import pickle

    from dlo.runtime import progress

    bar = progress.text_bar_class()
    for _ in bar(range(2), file=io.StringIO()):  # a bar has run: tqdm has set its class-level lock
        pass
    assert pickle.loads(pickle.dumps(bar)) is bar is progress.TextBar
    cloudpickle = pytest.importorskip("cloudpickle")
    scope = {"tqdm": bar}
    exec("def trainable(config):\n    return sum(tqdm(range(3), file=config))", scope)
    assert pickle.loads(cloudpickle.dumps(scope["trainable"]))(io.StringIO()) == 3
