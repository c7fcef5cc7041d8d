"""Tests of dlo.data: finding CIFAR-10, the generated stand-in, transforms and loaders.

Real CIFAR-10 is never needed: generated folders (small, in tmp_path) play its part, and "real" loading is
exercised by copying generated files without their marker (which then fail the real md5 check, as they should)
or, for the success path only, by switching torchvision's md5 check off.
"""
from __future__ import annotations

import json
import os
import pickle
import shutil
import warnings

import numpy as np
import pytest
from pathlib import Path
import torch

import dlo  # noqa: F401  (before torchvision: prepares its import)
from dlo import data
from dlo.runtime import paths
import dlo.data.generated

import torchvision  # noqa: E402
import torchvision.datasets.cifar as tv_cifar  # noqa: E402

N_TRAIN, N_TEST = 500, 200
BATCH_FILES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch", "batches.meta"]


def one_line(exc_info) -> str:
    msg = str(exc_info.value)
    assert msg and "\n" not in msg, f"error message should be one line: {msg!r}"
    return msg


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """No real data, no project cache: every test sees only its own tmp_path."""
    monkeypatch.delenv("DLO_DATA_DIR", raising=False)
    monkeypatch.delenv("DSDIR", raising=False)
    monkeypatch.setattr(paths, "CACHE_DIR", tmp_path / "cache")
    monkeypatch.setattr(paths, "ROOT", tmp_path / "project")


@pytest.fixture(scope="module")
def gen_root(tmp_path_factory):
    """One small generated dataset shared by the read-only tests of this module."""
    return data.make_generated_cifar10(tmp_path_factory.mktemp("gen") / "g", N_TRAIN, N_TEST, seed=0)


def copy_as_real(src_root, dst_root):
    """A copy of a generated folder without its marker: looks like (broken) real CIFAR-10."""
    shutil.copytree(src_root / data.BASE_FOLDER, dst_root / data.BASE_FOLDER)
    (dst_root / data.BASE_FOLDER / data.MARKER_NAME).unlink()
    return dst_root


def no_md5_check(monkeypatch):
    """Make torchvision's CIFAR10 accept any present file: bypasses the md5 check and nothing else."""
    monkeypatch.setattr(tv_cifar, "check_integrity", lambda fpath, md5=None: os.path.isfile(fpath))


# ---------------------------------------------------------------------------------------------------------
# The generated dataset
# ---------------------------------------------------------------------------------------------------------

def test_generated_files_are_deterministic(tmp_path):
    a = data.make_generated_cifar10(tmp_path / "a", 100, 50, seed=0)
    b = data.make_generated_cifar10(tmp_path / "b", 100, 50, seed=0)
    c = data.make_generated_cifar10(tmp_path / "c", 100, 50, seed=1)
    assert a == tmp_path / "a"
    names = sorted(os.listdir(a / data.BASE_FOLDER))
    assert names == sorted(BATCH_FILES + [data.MARKER_NAME])
    for name in names:
        assert (a / data.BASE_FOLDER / name).read_bytes() == (b / data.BASE_FOLDER / name).read_bytes(), name
    for name in ["data_batch_1", "test_batch"]:
        assert (a / data.BASE_FOLDER / name).read_bytes() != (c / data.BASE_FOLDER / name).read_bytes(), name
    marker = json.loads((c / data.BASE_FOLDER / data.MARKER_NAME).read_text())
    assert (marker["seed"], marker["n_train"], marker["n_test"]) == (1, 100, 50)


def test_pickles_have_the_cifar_layout(gen_root):
    folder = gen_root / data.BASE_FOLDER
    # As on the CIFAR-10 web page: encoding="bytes" gives bytes keys.
    with open(folder / "data_batch_1", "rb") as f:
        batch = pickle.load(f, encoding="bytes")
    assert list(batch) == [b"batch_label", b"labels", b"data", b"filenames"]
    assert batch[b"data"].dtype == np.uint8 and batch[b"data"].shape == (N_TRAIN // 5, 3072)
    assert len(batch[b"labels"]) == len(batch[b"filenames"]) == N_TRAIN // 5
    assert all(isinstance(label, int) and 0 <= label < 10 for label in batch[b"labels"])
    # As torchvision reads it: encoding="latin1" gives str keys.
    with open(folder / "batches.meta", "rb") as f:
        meta = pickle.load(f, encoding="latin1")
    assert meta["label_names"] == list(data.CLASSES) and meta["num_vis"] == 3072
    sizes = []
    for name in BATCH_FILES[:6]:
        with open(folder / name, "rb") as f:
            sizes.append(len(pickle.load(f, encoding="latin1")["labels"]))
    assert sizes == [N_TRAIN // 5] * 5 + [N_TEST]


def test_plain_torchvision_cifar10_reads_generated_files(gen_root, monkeypatch):
    ours = data.GeneratedCIFAR10(gen_root, train=True)
    no_md5_check(monkeypatch)
    for train, n in [(True, N_TRAIN), (False, N_TEST)]:
        plain = torchvision.datasets.CIFAR10(str(gen_root), train=train)
        assert type(plain) is torchvision.datasets.CIFAR10
        assert plain.data.shape == (n, 32, 32, 3) and plain.data.dtype == np.uint8
        assert len(plain.targets) == n and set(plain.targets) == set(range(10))
        assert plain.classes == list(data.CLASSES)
        image, label = plain[0]
        assert image.size == (32, 32) and image.mode == "RGB" and isinstance(label, int)
    plain = torchvision.datasets.CIFAR10(str(gen_root), train=True)
    assert np.array_equal(plain.data, ours.data) and plain.targets == ours.targets


def test_safe_reader_gives_what_torchvision_gives(gen_root, tmp_path, monkeypatch):
    """CIFAR10Files (no pickle.load) reads the same arrays, labels and classes as torchvision's CIFAR10."""
    no_md5_check(monkeypatch)
    for train in (True, False):
        ours = data.format.CIFAR10Files(str(gen_root), train=train)
        plain = torchvision.datasets.CIFAR10(str(gen_root), train=train)
        assert ours.data.dtype == plain.data.dtype and ours.data.shape == plain.data.shape
        assert np.array_equal(ours.data, plain.data) and ours.targets == plain.targets
        assert ours.classes == plain.classes and ours.class_to_idx == plain.class_to_idx
    # Python 3 pickles of the same content (numpy._core names, str keys; protocol 5 arrays) are read too.
    folder = gen_root / data.BASE_FOLDER
    with open(folder / "test_batch", "rb") as f:
        entry = pickle.load(f, encoding="latin1")
    for protocol in (2, pickle.HIGHEST_PROTOCOL):
        py3 = tmp_path / f"py3-{protocol}.pickle"
        py3.write_bytes(pickle.dumps(entry, protocol=protocol))
        again = data.format.load_batch(py3)
        assert np.array_equal(again["data"], entry["data"]) and again["labels"] == entry["labels"]


def test_generated_classes_are_balanced(gen_root):
    train = data.GeneratedCIFAR10(gen_root, train=True)
    test = data.GeneratedCIFAR10(gen_root, train=False)
    assert np.bincount(train.targets, minlength=10).tolist() == [N_TRAIN // 10] * 10
    assert np.bincount(test.targets, minlength=10).tolist() == [N_TEST // 10] * 10
    assert train.targets[:20] != sorted(train.targets[:20])  # shuffled, not sorted by class
    assert not any(np.array_equal(a, b) for a, b in zip(train.data[:50], test.data[:50]))


def test_changed_file_is_detected(gen_root, tmp_path):
    root = tmp_path / "copy"
    shutil.copytree(gen_root, root)
    path = root / data.BASE_FOLDER / "data_batch_2"
    raw = bytearray(path.read_bytes())
    raw[-100] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(RuntimeError) as exc:
        data.GeneratedCIFAR10(root, train=False)
    assert "data_batch_2" in one_line(exc)
    with pytest.raises(FileExistsError) as exc:  # and it is not silently reused
        data.make_generated_cifar10(root, N_TRAIN, N_TEST, seed=0)
    assert "overwrite=True" in one_line(exc)
    data.make_generated_cifar10(root, N_TRAIN, N_TEST, seed=0, overwrite=True)
    assert data.GeneratedCIFAR10(root, train=True).data.shape == (N_TRAIN, 32, 32, 3)


def test_bad_markers_are_detected(gen_root, tmp_path):
    root = tmp_path / "copy"
    shutil.copytree(gen_root, root)
    marker_path = root / data.BASE_FOLDER / data.MARKER_NAME
    good = json.loads(marker_path.read_text())

    marker_path.write_text(json.dumps({**good, "seed": 7}))  # other settings than asked
    with pytest.raises(FileExistsError) as exc:
        data.make_generated_cifar10(root, N_TRAIN, N_TEST, seed=0)
    assert "seed 7" in one_line(exc)

    marker_path.write_text(json.dumps({**good, "version": 0}))
    with pytest.raises(ValueError) as exc:
        data.read_generated_marker(root / data.BASE_FOLDER)
    assert "version" in one_line(exc)

    marker_path.write_text("{not json")
    with pytest.raises(ValueError) as exc:
        data.GeneratedCIFAR10(root)
    one_line(exc)

    marker_path.unlink()
    with pytest.raises(FileNotFoundError) as exc:
        data.GeneratedCIFAR10(root)
    one_line(exc)
    with pytest.raises(FileExistsError) as exc:  # a folder without marker is never overwritten
        data.make_generated_cifar10(root, N_TRAIN, N_TEST, seed=0, overwrite=True)
    assert "never overwritten" in one_line(exc)


def test_cache_with_wrong_marker_is_regenerated(gen_root):
    cache = data.generated_cache_root(N_TRAIN, N_TEST, 0)
    cache.parent.mkdir(parents=True)
    shutil.copytree(gen_root, cache)
    marker_path = cache / data.BASE_FOLDER / data.MARKER_NAME
    marker_path.write_text(json.dumps({**json.loads(marker_path.read_text()), "n_test": 3}))
    with pytest.warns(UserWarning, match="regenerating"):
        ds = data.cifar10("test", generated=True, n_train=N_TRAIN, n_test=N_TEST)
    assert len(ds) == N_TEST
    assert json.loads(marker_path.read_text())["n_test"] == N_TEST


def test_generator_validates_sizes(tmp_path):
    for kwargs in [dict(n_train=5), dict(n_test=0), dict(n_train=10.5), dict(seed=-1)]:
        with pytest.raises(ValueError) as exc:
            data.make_generated_cifar10(tmp_path / "x", **kwargs)
        one_line(exc)


# ---------------------------------------------------------------------------------------------------------
# cifar10(): which data, from where
# ---------------------------------------------------------------------------------------------------------

def test_generated_dataset_states_its_source(capsys):
    ds = data.cifar10("train", generated=True, n_train=N_TRAIN, n_test=N_TEST)
    printed = capsys.readouterr().out.strip().splitlines()
    assert len(printed) == 1 and ds.source in printed[0]
    assert ds.is_generated is True and ds.split == "train" and len(ds) == N_TRAIN
    assert "NOT real CIFAR-10" in ds.source and "seed 0" in ds.source
    assert str(data.generated_cache_root(N_TRAIN, N_TEST, 0)) in ds.source
    test = data.cifar10("test", n_train=N_TRAIN, n_test=N_TEST, verbose=False)  # None: nothing real -> generated
    assert capsys.readouterr().out == ""
    assert test.is_generated and len(test) == N_TEST


def test_generated_dataset_is_reused(monkeypatch):
    data.cifar10(generated=True, n_train=N_TRAIN, n_test=N_TEST, verbose=False)
    monkeypatch.setattr(dlo.data.generated, "_write_generated", lambda *a, **k: pytest.fail("cache not reused"))
    assert len(data.cifar10(generated=True, n_train=N_TRAIN, n_test=N_TEST, verbose=False)) == N_TRAIN


def test_split_and_flags_are_checked():
    with pytest.raises(ValueError) as exc:
        data.cifar10("val", generated=True)
    assert "'train' or 'test'" in one_line(exc)
    with pytest.raises(ValueError) as exc:
        data.cifar10(generated=True, download=True)
    one_line(exc)


def test_missing_data_dir_is_an_error(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError) as exc:
        data.cifar10(data_dir=missing)
    msg = one_line(exc)
    assert str(missing) in msg and "does not exist" in msg and data.BASE_FOLDER in msg
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError) as exc:
        data.cifar10(data_dir=empty, verbose=False)
    assert f"no {data.BASE_FOLDER}" in one_line(exc)


def test_required_real_data_is_an_error_when_absent():
    with pytest.raises(FileNotFoundError) as exc:
        data.cifar10(generated=False)
    assert "download=True" in one_line(exc)


def test_generated_files_claimed_as_real_fail_the_md5_check(gen_root):
    with pytest.raises(RuntimeError) as exc:
        data.cifar10(data_dir=gen_root, generated=False)
    msg = one_line(exc)
    assert "md5" in msg and "generated" in msg


def test_corrupt_real_data_is_an_error_never_a_fallback(gen_root, tmp_path):
    root = copy_as_real(gen_root, tmp_path / "real")
    (root / data.BASE_FOLDER / "data_batch_3").unlink()
    for generated in (None, False):
        with pytest.raises(RuntimeError) as exc:
            data.cifar10(data_dir=root, generated=generated)
        msg = one_line(exc)
        assert "md5" in msg and "missing data_batch_3" in msg and "data_batch_1" in msg


def test_real_data_path(gen_root, tmp_path, monkeypatch, capsys):
    root = copy_as_real(gen_root, tmp_path / "real")
    no_md5_check(monkeypatch)  # stands in for genuine CIFAR-10 files
    ds = data.cifar10("train", data_dir=root / data.BASE_FOLDER, transform=data.test_transform())
    assert ds.is_generated is False and type(ds) is data.format.CIFAR10Files
    assert isinstance(ds, torchvision.datasets.CIFAR10)
    assert ds.source == f"real CIFAR-10 from {root / data.BASE_FOLDER} ({N_TRAIN} train images)"
    assert capsys.readouterr().out.strip() == f"[dlo.data] {ds.source}"
    image, label = ds[0]
    assert image.shape == (3, 32, 32) and image.dtype == torch.float32


def test_search_order_and_layouts(gen_root, tmp_path, monkeypatch):
    a = copy_as_real(gen_root, tmp_path / "a")
    b = copy_as_real(gen_root, tmp_path / "b")
    ds = tmp_path / "dsdir"
    copy_as_real(gen_root, ds / "CIFAR-10")

    assert data.find_cifar10() is None
    monkeypatch.setenv("DSDIR", str(ds))
    assert data.find_cifar10() == ds / "CIFAR-10"
    monkeypatch.setenv("DLO_DATA_DIR", str(b))
    assert data.find_cifar10() == b
    assert data.find_cifar10(a) == a  # the argument wins
    assert data.find_cifar10(a / data.BASE_FOLDER) == a  # the folder itself is fine too
    monkeypatch.setenv("DLO_DATA_DIR", str(tmp_path / "typo"))
    with pytest.raises(FileNotFoundError) as exc:  # a named folder is never skipped
        data.find_cifar10()
    assert "DLO_DATA_DIR" in one_line(exc)


def test_dsdir_without_cifar_falls_back_to_generated(tmp_path, monkeypatch):
    (tmp_path / "dsdir" / "imagenet").mkdir(parents=True)
    monkeypatch.setenv("DSDIR", str(tmp_path / "dsdir"))
    ds = data.cifar10("test", n_train=N_TRAIN, n_test=N_TEST, verbose=False)
    assert ds.is_generated


def test_generated_folder_found_via_env_is_read_as_generated(gen_root, monkeypatch):
    monkeypatch.setenv("DLO_DATA_DIR", str(gen_root))
    ds = data.cifar10("test", verbose=False)
    assert ds.is_generated and len(ds) == N_TEST and str(gen_root) in ds.source


def test_misnamed_batch_folder_gets_a_hint(gen_root, tmp_path):
    odd = tmp_path / "my-cifar"
    shutil.copytree(gen_root / data.BASE_FOLDER, odd)
    with pytest.raises(FileNotFoundError) as exc:
        data.cifar10(data_dir=odd)
    assert "rename" in one_line(exc)


# ---------------------------------------------------------------------------------------------------------
# Transforms
# ---------------------------------------------------------------------------------------------------------

def test_transforms(gen_root):
    ds = data.GeneratedCIFAR10(gen_root, train=False)
    image, _ = ds[0]
    for tf in (data.train_transform(), data.train_transform(augment=False), data.test_transform()):
        out = tf(image)
        assert isinstance(out, torch.Tensor) and out.shape == (3, 32, 32) and out.dtype == torch.float32
    test = data.test_transform()
    assert torch.equal(test(image), test(image))
    expected = (torch.from_numpy(ds.data[0]).permute(2, 0, 1) / 255 - torch.tensor(data.CIFAR10_MEAN)[:, None, None]) \
        / torch.tensor(data.CIFAR10_STD)[:, None, None]
    assert torch.allclose(test(image), expected, atol=1e-5)
    torch.manual_seed(0)
    augmented = [data.train_transform()(image) for _ in range(8)]
    assert any(not torch.equal(augmented[0], a) for a in augmented[1:])
    assert len(data.CLASSES) == 10 and len(data.CIFAR10_MEAN) == len(data.CIFAR10_STD) == 3


# ---------------------------------------------------------------------------------------------------------
# Loaders and batches
# ---------------------------------------------------------------------------------------------------------

def tensor_dataset(n=100):
    return torch.utils.data.TensorDataset(torch.arange(n).float().view(n, 1), torch.arange(n))


def test_make_loader_rejects_bad_settings():
    ds = tensor_dataset()
    bad = [dict(batch_size=0), dict(batch_size=-4), dict(batch_size=2.0), dict(batch_size=True),
           dict(batch_size=8, num_workers=-1), dict(batch_size=8, prefetch_factor=2),
           dict(batch_size=8, persistent_workers=True), dict(batch_size=8, seed=1, generator=torch.Generator()),
           dict(batch_size=8, sampler=torch.utils.data.SequentialSampler(ds), shuffle=True)]
    for kwargs in bad:
        with pytest.raises(ValueError) as exc:
            data.make_loader(ds, **kwargs)
        one_line(exc)
    with pytest.raises(ValueError) as exc:
        data.make_loader(ds, 8, prefetch_factor=4)
    assert "num_workers" in one_line(exc)


def test_make_loader_warns_about_too_many_workers(monkeypatch):
    cores = data.available_cores()
    assert 1 <= cores <= (os.cpu_count() or cores)
    monkeypatch.setattr(data, "available_cores", lambda: 2)
    with pytest.warns(UserWarning) as record:
        loader = data.make_loader(tensor_dataset(), 8, num_workers=3, prefetch_factor=2, persistent_workers=True)
    msg = str(record[0].message)
    assert "num_workers=3" in msg and "2 CPU cores" in msg and "--cpus-per-task" in msg
    assert loader.num_workers == 3 and loader.prefetch_factor == 2 and loader.persistent_workers
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        data.make_loader(tensor_dataset(), 8, num_workers=2)  # within the cores: no warning


def test_seeded_loaders_repeat_their_order():
    def order(**kwargs):
        return torch.cat([y for _, y in data.make_loader(tensor_dataset(), 16, **kwargs)]).tolist()

    first = order(seed=3)
    assert first == order(seed=3)
    assert first != order(seed=4)
    assert sorted(first) == list(range(100)) and first != list(range(100))
    assert order(shuffle=False) == list(range(100))
    loader = data.make_loader(tensor_dataset(), 16, sampler=torch.utils.data.SequentialSampler(tensor_dataset()))
    assert torch.cat([y for _, y in loader]).tolist() == list(range(100))  # the sampler decides, no shuffle
    assert len(data.make_loader(tensor_dataset(), 16, drop_last=True)) == 6


def test_preload_batches(gen_root):
    ds = data.GeneratedCIFAR10(gen_root, train=False, transform=data.test_transform())
    batches = data.preload_batches(ds, 3, batch_size=8)
    assert len(batches) == 3
    for x, y in batches:
        assert x.shape == (8, 3, 32, 32) and x.dtype == torch.float32 and y.shape == (8,) and y.dtype == torch.int64
    assert torch.equal(batches[1][0][0], ds[8][0])  # consecutive items
    loader = data.make_loader(ds, 16, seed=0)
    from_loader = data.preload_batches(loader, 2, channels_last=True)
    assert from_loader[0][0].shape == (16, 3, 32, 32)
    assert from_loader[0][0].is_contiguous(memory_format=torch.channels_last)
    with pytest.raises(ValueError):
        data.preload_batches(ds, 2)  # a Dataset needs batch_size
    with pytest.raises(ValueError):
        data.preload_batches(ds, 100, batch_size=8)  # more than there is
    with pytest.raises(ValueError):
        data.preload_batches(loader, 2, batch_size=32)
    with pytest.raises(TypeError) as exc:
        data.preload_batches(data.GeneratedCIFAR10(gen_root, train=False), 1, batch_size=4)  # PIL images
    assert "transform" in one_line(exc)


def test_synthetic_batch():
    x, y = data.synthetic_batch(6, seed=1)
    assert x.shape == (6, 3, 32, 32) and x.dtype == torch.float32
    assert y.shape == (6,) and y.dtype == torch.int64 and 0 <= y.min() and y.max() < 10
    x2, y2 = data.synthetic_batch(6, seed=1)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    assert not torch.equal(x, data.synthetic_batch(6, seed=2)[0])
    assert data.synthetic_batch(2, channels_last=True)[0].is_contiguous(memory_format=torch.channels_last)
    with pytest.raises(ValueError):
        data.synthetic_batch(0)


# ---------------------------------------------------------------------------------------------------------
# Learnability: classes must be learnable, and not from colour alone
# ---------------------------------------------------------------------------------------------------------

def normalised(ds):
    x = torch.from_numpy(ds.data).permute(0, 3, 1, 2).float().div(255)
    mean = torch.tensor(data.CIFAR10_MEAN)[:, None, None]
    std = torch.tensor(data.CIFAR10_STD)[:, None, None]
    return (x - mean) / std, torch.tensor(ds.targets)


def test_generated_data_is_learnable_by_a_tiny_cnn(gen_root):
    xtr, ytr = normalised(data.GeneratedCIFAR10(gen_root, train=True))
    xte, yte = normalised(data.GeneratedCIFAR10(gen_root, train=False))
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 7, stride=2, padding=3), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(0)
    for _ in range(150):
        idx = torch.randint(0, len(xtr), (32,), generator=gen)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xtr[idx]), ytr[idx]).backward()
        opt.step()
    with torch.no_grad():
        accuracy = (model(xte).argmax(1) == yte).float().mean().item()
    assert accuracy > 0.22, accuracy  # chance is 0.10; about 0.33 is typical after 150 steps on 500 images


def test_classes_differ_by_texture_not_only_by_colour(gen_root):
    """Colour alone gets some classes; the texture (shift-invariant Fourier magnitudes) gets many more."""
    def features(ds):
        x = torch.from_numpy(ds.data).permute(0, 3, 1, 2).float().div(255)
        spectrum = torch.fft.rfft2(x - x.mean((2, 3), keepdim=True)).abs()
        low = torch.cat([spectrum[..., :8, :8], spectrum[..., -8:, :8]], dim=-2)  # low frequencies, both signs
        return x.mean((2, 3)), low.flatten(1).log1p(), torch.tensor(ds.targets)

    ctr, ftr, ytr = features(data.GeneratedCIFAR10(gen_root, train=True))
    cte, fte, yte = features(data.GeneratedCIFAR10(gen_root, train=False))
    centroids = torch.stack([ctr[ytr == c].mean(0) for c in range(10)])
    colour_accuracy = (torch.cdist(cte, centroids).argmin(1) == yte).float().mean().item()

    xtr, xte = torch.cat([ctr, ftr], 1), torch.cat([cte, fte], 1)
    mu, sd = xtr.mean(0), xtr.std(0) + 1e-6
    xtr, xte = (xtr - mu) / sd, (xte - mu) / sd
    torch.manual_seed(0)
    linear = torch.nn.Linear(xtr.shape[1], 10)
    opt = torch.optim.Adam(linear.parameters(), lr=1e-2, weight_decay=1e-3)
    for _ in range(150):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(linear(xtr), ytr).backward()
        opt.step()
    with torch.no_grad():
        texture_accuracy = (linear(xte).argmax(1) == yte).float().mean().item()
    assert 0.12 < colour_accuracy < 0.5, colour_accuracy  # some signal, far from "trivially 100 %"
    assert texture_accuracy > 0.35 and texture_accuracy > colour_accuracy + 0.1, (texture_accuracy, colour_accuracy)


@pytest.mark.parametrize("where", ["a-file", "under-a-file", "/proc/dlo-test", "read-only"])
def test_dlo_data_generated_into_a_bad_folder_is_one_line(where, tmp_path, capsys, as_unprivileged, read_only_folder):
    """`dlo data --generated --data-dir X` writes the set into X: a file, a path under a file, an unwritable
    place or a read-only folder is refused in one line (exit 2) before anything is generated."""
    from dlo.cli import main

    (tmp_path / "a-file").write_text("x")
    target = {"a-file": tmp_path / "a-file", "under-a-file": tmp_path / "a-file" / "sub",
              "/proc/dlo-test": Path("/proc/dlo-test"), "read-only": read_only_folder[0] / "data"}[where]

    def fn():
        import contextlib
        import io

        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rc = main(["data", "--generated", "--data-dir", str(target)])
        return [rc, err.getvalue()]

    rc, err = as_unprivileged(fn) if where == "read-only" else fn()
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("error: --data-dir"), err
    assert (tmp_path / "a-file").read_text() == "x"
