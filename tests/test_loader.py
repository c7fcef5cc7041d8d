"""Tests of dlo.lessons.loader: transforms, profiling a DataLoader, choosing a setting, core and shared-memory budgets.

Datasets are tiny (in memory, or a small generated CIFAR folder in a temporary directory) and thresholds
are loose: the machine running the tests may have 2 busy cores.
"""
from __future__ import annotations

import time

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

import dlo  # noqa: F401,E402  (before torchvision)
from dlo import data
from dlo.lessons import loader as dl
from dlo.lessons import loader_plots


class TensorItems(Dataset):
    """``n`` items ``(float tensor [3, 8, 8], label)``; ``sleep_s`` per item simulates slow reading/decoding."""

    def __init__(self, n: int = 64, sleep_s: float = 0.0) -> None:
        self.n, self.sleep_s = n, sleep_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return torch.full((3, 8, 8), float(i)), i % 10


def slow_worker_start(worker_id: int) -> None:  # module level: picklable for any start method
    time.sleep(0.5)


def sleep_step(seconds: float):
    def step(images, labels):
        time.sleep(seconds)
    return step


@pytest.fixture(scope="module")
def cifar_small(tmp_path_factory):
    root = tmp_path_factory.mktemp("cifar")
    return data.cifar10("train", data_dir=root, generated=True, transform=dl.heavy_transform(), n_train=256,
                        n_test=64, verbose=False)


def pil_image(seed: int = 0) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (32, 32, 3), dtype=np.uint8))


# --------------------------------------------------------------------------------------------------------
# Transforms
# --------------------------------------------------------------------------------------------------------

def test_heavy_transform_shape_and_work():
    img = pil_image()
    for size in (32, 48):
        out = dl.heavy_transform(size)(img)
        assert out.dtype == torch.float32 and tuple(out.shape) == (3, size, size)
    light = dl.light_transform()(img)
    assert light.dtype == torch.float32 and tuple(light.shape) == (3, 32, 32)

    # its extra cost is counted, not timed: the light pipeline's steps, preceded by a random crop, a flip and two
    # RandAugment operations per image, all on the PIL image; and those make every call a different image
    from torchvision.transforms import v2

    heavy = dl.heavy_transform().transforms
    assert [type(t) for t in heavy[-len(dl.light_transform().transforms):]] == \
        [type(t) for t in dl.light_transform().transforms]
    assert [type(t) for t in heavy[:3]] == [v2.RandomResizedCrop, v2.RandomHorizontalFlip, v2.RandAugment]
    assert heavy[2].num_ops == 2 and heavy[2].magnitude == 9
    torch.manual_seed(0)
    outs = [dl.heavy_transform()(img) for _ in range(4)]
    assert all(not torch.equal(outs[0], o) for o in outs[1:])
    assert torch.equal(dl.light_transform()(img), light)


# --------------------------------------------------------------------------------------------------------
# profile_loader
# --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("workers", [0, 2])
def test_profile_loader_records(cifar_small, workers):
    loader = data.make_loader(cifar_small, 32, num_workers=workers, seed=0)
    trial = dl.profile_loader(loader, 5, desc=f"w{workers}", progress=False)
    assert trial.n_iters == 5
    assert len(trial.wait_s) == len(trial.copy_s) == len(trial.compute_s) == len(trial.batch_sizes) == 5
    assert trial.compute_s == [0.0] * 5  # no compute given
    assert trial.first_batch_s == trial.wait_s[0] >= trial.iter_s > 0
    # iteration 0 is out of the steady state
    assert trial.steady_s == pytest.approx(sum(trial.wait_s[1:]) + sum(trial.copy_s[1:]))
    assert trial.throughput == pytest.approx(4 * 32 / trial.steady_s)
    assert trial.throughput > 0 and trial.n_images == 160
    assert trial.memory_metric in ("rss", "pss")
    assert len(trial.main_bytes) == len(trial.workers_bytes) == 5
    assert trial.peak_main_bytes > 0
    assert trial.peak_total_bytes >= trial.peak_main_bytes
    if workers:
        assert trial.peak_workers_bytes > 0
    else:
        assert trial.peak_workers_bytes == 0

    row = trial.row()
    for knob in dl.LOADER_KNOBS:
        assert knob in row
    assert row["num_workers"] == workers and row["batch_size"] == 32 and row["prefetch_factor"] == (2 if workers else None)
    for key in ("first_batch_s", "median_wait_ms", "median_compute_ms", "wait_fraction", "throughput",
                "peak_main_mib", "peak_workers_mib", "peak_total_mib", "memory_metric", "label"):
        assert key in row
    tl = trial.timeline()
    assert list(tl["iteration"]) == list(range(5)) and list(tl["steady"]) == [False] + [True] * 4
    assert {"wait_s", "copy_s", "compute_s", "start_s", "main_mib", "workers_mib"} <= set(tl.columns)
    assert "img/s" in str(trial)


def test_profile_loader_stops_with_a_short_loader_and_without_memory():
    loader = DataLoader(TensorItems(20), batch_size=8)  # 3 batches (8, 8, 4)
    trial = dl.profile_loader(loader, 10, sample_memory=False, progress=False)
    assert trial.n_iters == 3 and trial.batch_sizes == [8, 8, 4]
    assert trial.memory_metric is None and trial.peak_total_bytes is None and trial.row()["peak_total_mib"] is None
    with pytest.raises(ValueError, match="n_iters"):
        dl.profile_loader(loader, 1)


def test_slow_data_makes_the_loop_wait():
    loader = DataLoader(TensorItems(64, sleep_s=0.005), batch_size=8)  # ~40 ms of loading per batch
    trial = dl.profile_loader(loader, 5, compute=sleep_step(0.001), progress=False)
    assert trial.wait_fraction > 0.5
    assert all(c > 0 for c in trial.compute_s)


def test_workers_hide_fast_loading_behind_slow_compute():
    loader = DataLoader(TensorItems(64), batch_size=8, num_workers=1, prefetch_factor=2)
    trial = dl.profile_loader(loader, 6, compute=sleep_step(0.04), progress=False)
    assert trial.wait_fraction < 0.3
    assert trial.median_compute_s >= 0.035


def test_epoch_start_latency_with_and_without_persistent_workers():
    def make(persistent):
        return DataLoader(TensorItems(32), batch_size=8, num_workers=1, persistent_workers=persistent,
                          worker_init_fn=slow_worker_start)

    persistent = dl.epoch_start_latency(make(True), n_epochs=2)
    assert len(persistent) == 2
    assert persistent[0] > 0.45  # pays the worker start
    assert persistent[1] < 0.5 * persistent[0]  # workers kept: no restart
    fresh = dl.epoch_start_latency(make(False), n_epochs=2)
    assert min(fresh) > 0.45  # every epoch restarts its worker


# --------------------------------------------------------------------------------------------------------
# Overlapping the copy with the compute: the loop's device calls, counted on a simulated GPU
# --------------------------------------------------------------------------------------------------------

class _Event:
    t = None


class FakeGpu(dl.TransferOps):
    """A device with a copy engine on a virtual clock: each tensor copy takes ``copy_s`` on the stream it is
    issued on, ``run`` advances the current stream, ``wait_for`` makes the main stream wait for the copy
    stream, ``synchronize`` lets both finish. Every call is logged, in order."""

    def __init__(self, pinned: bool = True, copy_s: float = 1.0) -> None:
        super().__init__("cpu")
        self.pinned, self.copy_s = pinned, copy_s
        self.clock = {"main": 0.0, "copy": 0.0}
        self.current = "main"
        self.log: list[str] = []

    def is_pinned(self, x) -> bool:
        return self.pinned

    def new_stream(self):
        return "copy"

    def on_stream(self, stream):
        import contextlib

        @contextlib.contextmanager
        def switch():
            before, self.current = self.current, stream or self.current
            try:
                yield
            finally:
                self.current = before
        return switch()

    def event(self):
        return _Event()

    def record(self, event, stream=None) -> None:
        event.t = self.clock[stream or self.current]

    def copy(self, x, non_blocking: bool):
        self.log.append(f"copy:{self.current}:{'nb' if non_blocking else 'blocking'}")
        self.clock[self.current] += self.copy_s
        return x

    def wait_for(self, stream) -> None:
        self.log.append("wait_for")
        self.clock["main"] = max(self.clock["main"], self.clock[stream])

    def hand_over(self, *tensors) -> None:
        self.log.append("hand_over")

    def synchronize(self) -> None:
        super().synchronize()
        self.log.append("sync")
        self.clock["main"] = self.clock["copy"] = max(self.clock.values())

    def seconds(self, start, end) -> float:
        return end.t - start.t

    def run(self, seconds: float) -> None:
        self.log.append("compute")
        self.clock[self.current] += seconds


def _fake_trial(gpu: FakeGpu, n: int = 6, non_blocking: bool = True, step_s: float = 5.0):
    loader = DataLoader(TensorItems(8 * n), batch_size=8)
    return dl.profile_loader(loader, n, compute=lambda x, y: gpu.run(step_s), non_blocking=non_blocking,
                             sample_memory=False, progress=False, ops=gpu)


def _syncs_between_copies(log: list[str]) -> list[int]:
    """Per pair of consecutive batches (two copies each: images, labels), the synchronisations between them."""
    batches = [i for i, e in enumerate(log) if e.startswith("copy")][::2]
    return [log[a:b].count("sync") for a, b in zip(batches, batches[1:])]


def test_pinned_non_blocking_copies_run_on_a_copy_stream_without_a_sync_per_copy():
    gpu = FakeGpu(pinned=True)
    trial = _fake_trial(gpu, n=6)
    assert trial.mode == "overlap" and trial.pinned is True
    assert all(e == "copy:copy:nb" for e in gpu.log if e.startswith("copy"))  # on the copy stream, non-blocking
    # one sync after iteration 0 (its one-off costs), then none between the steady copies, one at the end
    assert _syncs_between_copies(gpu.log) == [1, 0, 0, 0, 0]
    assert gpu.log[-1] == "sync" and trial.syncs == gpu.syncs == 3  # + the one before the clock starts
    # each step waits for its batch on the device (not the host), and takes the tensors over from the copy stream
    assert gpu.log.count("wait_for") == gpu.log.count("compute") == 6
    assert all(gpu.log[i - 2:i] == ["wait_for", "hand_over"] for i, e in enumerate(gpu.log) if e == "compute")
    # batch i+1's copy (2 units) runs during step i (5 units): hidden, except batch 1's (nothing computes then)
    assert trial.copy_s == [2.0] * 6 and trial.compute_s == [5.0] * 6
    assert trial.overlap_s[1:] == [0.0, 2.0, 2.0, 2.0, 2.0]
    assert trial.copy_hidden == pytest.approx(4 / 5)
    assert trial.steady_wall_s is not None and trial.row()["mode"] == "overlap"


@pytest.mark.parametrize("pinned, non_blocking", [(False, True), (True, False), (False, False)])
def test_without_pinned_memory_and_non_blocking_the_loop_syncs_once_per_step(pinned, non_blocking):
    gpu = FakeGpu(pinned=pinned)
    trial = _fake_trial(gpu, n=5, non_blocking=non_blocking)
    assert trial.mode == "serial" and trial.pinned is pinned
    assert all(e.startswith("copy:main") for e in gpu.log if e.startswith("copy"))  # no copy stream
    assert _syncs_between_copies(gpu.log) == [1, 1, 1, 1]
    assert trial.syncs == 1 + 5 and "wait_for" not in gpu.log
    assert trial.overlap_s == [0.0] * 5 and trial.copy_hidden == 0.0  # copy, then step: one after the other
    assert trial.steady_wall_s is None


def test_overlap_seconds_is_the_intersection_with_the_union_of_the_computes():
    computes = [(2.0, 7.0), (6.0, 9.0), (12.0, 14.0)]
    assert dl.overlap_seconds([(0.0, 2.0), (1.0, 3.0), (8.0, 13.0), (5.0, 6.0)], computes) == [0.0, 1.0, 2.0, 1.0]
    assert dl.overlap_seconds([(0.0, 1.0)], []) == [0.0]


def test_on_a_cpu_the_batches_are_not_pinned_and_the_sentence_says_what_cannot_be_seen():
    loader = DataLoader(TensorItems(32), batch_size=8)
    trial = dl.profile_loader(loader, 3, non_blocking=True, sample_memory=False, progress=False)
    assert trial.mode == "serial" and trial.pinned is False  # non_blocking alone does not overlap anything
    sentence = dl.overlap_sentence(trial)
    assert "no copy engine" in sentence and f"{trial.median_copy_s * 1000:.3f} ms" in sentence


def test_overlap_sentence_on_a_gpu_is_written_from_the_numbers():
    gpu = FakeGpu(pinned=True)
    fast = _fake_trial(gpu, n=6)
    fast.device, fast.label = "cuda:0", "pinned"
    slow = _fake_trial(FakeGpu(pinned=False), n=6)
    slow.device, slow.label = "cuda:0", "pageable"
    s = dl.overlap_sentence(fast, slow)
    assert s.startswith("In pinned, 80% of the copy time (2000.00 ms per batch, median) ran while a training step")
    assert "3 host synchronisations in 6 iterations" in s and "pageable (serial, 7 synchronisations)" in s
    assert "not in pinned memory" in dl.overlap_sentence(slow)


# --------------------------------------------------------------------------------------------------------
# Choosing
# --------------------------------------------------------------------------------------------------------

def _table(rows):
    return pd.DataFrame([{"num_workers": w, "prefetch_factor": pf, "throughput": thr, "wait_fraction": wf,
                          "peak_total_mib": mem} for w, pf, thr, wf, mem in rows])


def test_best_setting_prefers_the_fastest_then_the_cheapest():
    df = _table([(0, None, 500.0, 0.9, 300.0), (1, 2, 1000.0, 0.2, 500.0), (2, 2, 1500.0, 0.05, 700.0)])
    row, reason = dl.best_setting(df)
    assert row["num_workers"] == 2
    assert "1,500" in reason

    df = _table([(0, None, 500.0, 0.9, 300.0), (1, 2, 1480.0, 0.1, 500.0), (2, 2, 1500.0, 0.05, 700.0)])
    row, reason = dl.best_setting(df, tolerance=0.05)
    assert row["num_workers"] == 1
    assert "1,480" in reason and "1,500" in reason and "5%" in reason
    row, _ = dl.best_setting(df, tolerance=0.0)
    assert row["num_workers"] == 2

    # same workers: less memory wins
    df = _table([(2, 4, 1500.0, 0.05, 900.0), (2, 2, 1490.0, 0.06, 700.0)])
    row, _ = dl.best_setting(df)
    assert row["prefetch_factor"] == 2
    with pytest.raises(ValueError, match="tolerance"):
        dl.best_setting(df, tolerance=1.5)


def test_best_setting_on_real_trials():
    trials = [dl.profile_loader(DataLoader(TensorItems(48), batch_size=8), 3, progress=False),
              dl.profile_loader(DataLoader(TensorItems(48), batch_size=16), 3, progress=False)]
    df = pd.DataFrame([t.row() for t in trials])
    row, reason = dl.best_setting(df, tolerance=0.99)
    assert row["label"] in reason


def test_core_budget(monkeypatch):
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    monkeypatch.setattr(data, "available_cores", lambda: 16)
    b = dl.core_budget()
    assert b["available"] == 16 and b["slurm_cpus_per_task"] is None and b["max_workers_per_rank"] == 15
    assert dl.core_budget(4)["max_workers_per_rank"] == 3
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "8")
    b = dl.core_budget(2)
    assert b["slurm_cpus_per_task"] == 8 and b["cores"] == 8 and b["max_workers_per_rank"] == 3
    assert "SLURM_CPUS_PER_TASK=8" in b["explanation"]
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "1")
    assert dl.core_budget()["max_workers_per_rank"] == 0
    assert b["cpu_count"] >= 1
    with pytest.raises(ValueError):
        dl.core_budget(0)


def test_shm_status(monkeypatch, tmp_path):
    keys = {"path", "exists", "total_bytes", "free_bytes", "total_mib", "free_mib", "sharing_strategy",
            "sharing_strategies", "advice"}
    status = dl.shm_status(tmp_path)
    assert keys <= set(status) and status["exists"] and status["total_bytes"] > 0
    assert status["sharing_strategy"] in status["sharing_strategies"]
    monkeypatch.setattr(dl.advice, "SHM_PATH", tmp_path / "missing")
    status = dl.shm_status()
    assert keys <= set(status)
    assert status["exists"] is False and status["total_bytes"] is None and "does not exist" in status["advice"]


# --------------------------------------------------------------------------------------------------------
# Charts
# --------------------------------------------------------------------------------------------------------

def test_plots(tmp_path):
    from matplotlib.figure import Figure

    trials = [dl.profile_loader(DataLoader(TensorItems(32), batch_size=8), 4, compute=sleep_step(0.001),
                                progress=False),
              dl.profile_loader(DataLoader(TensorItems(32), batch_size=4), 4, progress=False)]
    fig = loader_plots.plot_timeline(trials, path=tmp_path / "timeline.png")
    assert isinstance(fig, Figure) and (tmp_path / "timeline.png").stat().st_size > 0
    fig = loader_plots.plot_timeline(trials[0], labels=["one"])
    assert isinstance(fig, Figure)
    df = pd.DataFrame([t.row() for t in trials]).drop(columns="label")  # labels then come from the settings
    fig = loader_plots.plot_trials(df, path=tmp_path / "sub" / "trials.png")
    assert isinstance(fig, Figure) and (tmp_path / "sub" / "trials.png").stat().st_size > 0
    assert dl.row_labels(df) == ["batch_size=8", "batch_size=4"]
    import matplotlib.pyplot as plt

    plt.close("all")
