"""Sharded checkpoints are whole or absent: a rank killed at any phase of a save never yields a loaded checkpoint
that differs from the step it reports, on 2 and 3 processes; an incomplete folder is named and never loaded; a
file that resolves outside the checkpoint folder (a link) is refused; a model of another shape is one line."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

import dlo  # noqa: F401
from dlo.parallel.fsdp import sharded_folders as folders
from dlo.runtime.launch import LaunchError, launch_forked

SCRIPT = Path(__file__).parent / "scripts" / "dcp_kill.py"

# (phase, victim rank or "last", the step a resume must load)
KILLS = [("start", "last", 3), ("own_shard_written", "last", 3), ("own_shard_written", 0, 3),
         ("before_metadata", 0, 3), ("shards_written", "last", 3), ("marker_written", 0, 3), ("committed", 0, 6)]


def _fake_save(root: Path, step: int, files=None, marker=True) -> Path:
    partial = folders.partial_folder(root, step)
    partial.mkdir(parents=True)
    for name, data in (files or {".metadata": b"m", "__0_0.distcp": b"abc"}).items():
        (partial / name).write_bytes(data)
    return folders.commit(partial, folders.step_folder(root, step), step, 1) if marker else partial


def test_the_newest_complete_folder_is_chosen_and_newer_incomplete_ones_named(tmp_path):
    _fake_save(tmp_path, 3)
    _fake_save(tmp_path, 6, marker=False)  # killed before its commit
    choice = folders.newest_complete(tmp_path)
    assert choice.folder == folders.step_folder(tmp_path, 3)
    assert len(choice.left_out) == 1 and ".partial-step-000000006 is incomplete" in choice.left_out[0]
    assert "loading step-000000003" in choice.describe()


def test_a_step_folder_with_a_file_cut_or_missing_or_no_marker_is_never_loaded(tmp_path):
    _fake_save(tmp_path, 3)
    cut = _fake_save(tmp_path, 6)
    (cut / "__0_0.distcp").write_bytes(b"a")  # one byte of three
    missing = _fake_save(tmp_path, 9)
    (missing / "__0_0.distcp").unlink()
    nomarker = _fake_save(tmp_path, 12)
    (nomarker / folders.MARKER).unlink()
    choice = folders.newest_complete(tmp_path)
    assert choice.folder.name == "step-000000003"
    reasons = " | ".join(choice.left_out)
    assert "step-000000006: __0_0.distcp has 1 bytes, the save wrote 3" in reasons
    assert "step-000000009: __0_0.distcp is missing" in reasons and "step-000000012: no COMPLETE.json" in reasons


def test_nothing_complete_is_one_line(tmp_path):
    _fake_save(tmp_path, 6, marker=False)
    with pytest.raises(FileNotFoundError) as err:
        folders.newest_complete(tmp_path)
    assert "no complete sharded checkpoint" in str(err.value) and "\n" not in str(err.value)


def test_a_step_folder_that_links_outside_is_not_loaded(tmp_path):
    outside = tmp_path / "elsewhere"
    _fake_save(outside, 9)
    root = tmp_path / "ckpt"
    _fake_save(root, 3)
    os.symlink(folders.step_folder(outside, 9), folders.step_folder(root, 9))
    choice = folders.newest_complete(root)
    assert choice.folder.name == "step-000000003" and "link to a folder outside" in " ".join(choice.left_out)


def test_the_commit_keeps_the_newest_and_prunes_older(tmp_path):
    for step in (3, 6, 9):
        _fake_save(tmp_path, step)
    removed = folders.prune(tmp_path, keep=2)
    assert [p.name for p in removed] == ["step-000000003"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000000006", "step-000000009"]
    marker = json.loads((folders.step_folder(tmp_path, 9) / folders.MARKER).read_text())
    assert marker["step"] == 9 and marker["files"] == {".metadata": 1, "__0_0.distcp": 3}


@pytest.mark.parametrize("world", [2, 3])
def test_a_rank_killed_at_any_phase_of_a_save_never_loads_a_mixed_checkpoint(tmp_path, world):
    env = {"OMP_NUM_THREADS": "1"}
    labels = []
    for phase, victim, _ in KILLS:
        label = f"{phase}-r{world - 1 if victim == 'last' else victim}"
        labels.append(label)
        with pytest.raises(LaunchError):
            launch_forked(SCRIPT, [str(tmp_path), "save", label], nproc=world, timeout_s=120, env=env)
        assert (tmp_path / f"{label}-expected.pt").is_file(), f"{label}: the run died before the kill"
    records = launch_forked(SCRIPT, [str(tmp_path), "load", *labels], nproc=world, timeout_s=240, env=env)
    got = {(r["label"], r["rank"]): r for r in records}
    for (phase, _, step), label in zip(KILLS, labels):
        for rank in range(world):
            rec = got[(label, rank)]
            assert rec["equal"] and not rec["equal_other"], f"{label}, rank {rank}: loaded weights are not step {rec['step']}'s"
            assert rec["step"] == step, f"{label}: resumed at step {rec['step']}, expected {step}"
    assert not list(tmp_path.glob("committed-r0/.partial-*"))


def test_a_shard_linked_to_a_file_outside_the_folder_is_refused(tmp_path):
    from torch.distributed.checkpoint.metadata import Metadata

    from dlo.parallel.fsdp.checkpoint import UnsafeCheckpoint, read_sharded_metadata
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import MetadataIndex
    import pickle

    folder = tmp_path / "ckpt"
    folder.mkdir()
    secret = tmp_path / "outside.distcp"
    secret.write_bytes(b"x" * 16)
    os.symlink(secret, folder / "__0_0.distcp")
    md = Metadata(state_dict_metadata={}, storage_data={MetadataIndex("model.w"): _StorageInfo("__0_0.distcp", 0, 16)})
    (folder / ".metadata").write_bytes(pickle.dumps(md))
    with pytest.raises(UnsafeCheckpoint, match="link to a file outside the checkpoint folder"):
        read_sharded_metadata(folder)
    os.unlink(folder / "__0_0.distcp")
    (folder / "__0_0.distcp").write_bytes(b"x" * 16)
    assert read_sharded_metadata(folder) is not None  # the same file inside the folder is read


def test_a_model_of_another_shape_is_one_line_naming_the_tensor():
    from torch.distributed.checkpoint.metadata import Metadata, TensorProperties, TensorStorageMetadata

    from dlo.parallel.fsdp.checkpoint import _check_shapes

    md = Metadata(state_dict_metadata={
        "model.0.weight": TensorStorageMetadata(TensorProperties(), torch.Size([10, 6]), []),
        "model.0.bias": TensorStorageMetadata(TensorProperties(), torch.Size([10]), [])})
    _check_shapes(md, {"0.weight": torch.zeros(10, 6), "0.bias": torch.zeros(10)}, Path("ck"))
    with pytest.raises(ValueError) as err:
        _check_shapes(md, {"0.weight": torch.zeros(12, 6), "0.bias": torch.zeros(12)}, Path("ck"))
    assert str(err.value) == ("sharded checkpoint ck: model.0.weight is (10, 6) there and (12, 6) in this model: "
                              "load it into the model it was saved from")
    with pytest.raises(ValueError, match="has no model.1.weight"):
        _check_shapes(md, {"1.weight": torch.zeros(2)}, Path("ck"))
