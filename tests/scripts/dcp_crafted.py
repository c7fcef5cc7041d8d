"""Sharded checkpoints of tests/test_security.py, in one process of a group of one (gloo, CPU).

Saves the smoke Llama with ``save_sharded``, loads it back with ``load_sharded`` (the round trip), then tries
folders made from that save: a ``.metadata`` whose pickle runs code, one whose shard entry points outside the
folder, and a real-looking ``.metadata`` whose non-tensor value (the optimizer's ``lr``) is a pickle that runs
code. Each attempt records its exception (type, text) and whether the marker file appeared.
Usage: ``dcp_crafted.py OUT_DIR`` (writes OUT_DIR/result.json).
"""
import dataclasses
import json
import pickle
import shutil
import sys
from pathlib import Path

import torch

import dlo  # noqa: F401
from dlo.data import tokens
from dlo.parallel import fsdp
from dlo.runtime import init_distributed, teardown


class WritesMarker:
    """Unpickling this object creates the file ``marker``: what a crafted checkpoint would do."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


out = Path(sys.argv[1])
cfg = fsdp.SMOKE_LLAMA
ctx = init_distributed(backend="gloo", device="cpu", group_of_one=True)
dataset, _ = tokens.token_dataset(32, vocab_size=cfg.vocab_size, n_sequences=8)


def fresh(seed: int):
    model = fsdp.apply_fsdp(fsdp.build_llama(cfg, seed=seed))
    return model, torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)


def attempt(name: str, folder: Path) -> None:
    marker = out / f"marker-{name}"
    model, opt = fresh(5)
    try:
        fsdp.load_sharded(folder, model, opt)
        result[name] = {"error": None}
    except Exception as exc:  # noqa: BLE001 - recorded for the test
        result[name] = {"error": type(exc).__name__, "message": str(exc)}
    result[name]["marker"] = marker.exists()


result = {}
try:
    real = out / "real"
    model, opt = fresh(0)
    fsdp.train_steps(model, opt, fsdp.batches(dataset, 2, 0, 1), 2, track_memory=False)
    saved_folder = fsdp.save_sharded(real, model, opt, step=2)  # real/step-000000002, committed
    saved = {k: v.full_tensor().clone() for k, v in model.state_dict().items()}
    model, opt = fresh(123)  # other weights: the load must overwrite them
    step = fsdp.load_sharded(real, model, opt)
    result["round_trip"] = {"step": step, "params_equal": all(torch.equal(saved[k], v.full_tensor())
                                                               for k, v in model.state_dict().items()),
                            "lr": opt.param_groups[0]["lr"], "betas": list(opt.param_groups[0]["betas"]),
                            "adam_steps": sorted({float(s["step"]) for s in opt.state.values()})}
    metadata = pickle.loads((saved_folder / ".metadata").read_bytes())  # our own save, just written

    # 1. a .metadata whose pickle runs code
    crafted = out / "crafted"
    shutil.copytree(saved_folder, crafted)
    (crafted / ".metadata").write_bytes(pickle.dumps(WritesMarker(str(out / "marker-metadata"))))
    attempt("metadata", crafted)

    # 2. only metadata classes, but a shard outside the folder
    outside = out / "outside"
    shutil.copytree(saved_folder, outside)
    key, info = next(iter(metadata.storage_data.items()))
    moved = dict(metadata.storage_data)
    moved[key] = dataclasses.replace(info, relative_path=f"../real/{saved_folder.name}/" + info.relative_path)
    with open(outside / ".metadata", "wb") as f:
        pickle.dump(dataclasses.replace(metadata, storage_data=moved), f)
    attempt("outside", outside)

    # 3. valid metadata, but the optimizer's lr (a non-tensor value, read with torch.load) runs code
    values = out / "values"
    shutil.copytree(saved_folder, values)
    torch.save(WritesMarker(str(out / "marker-values")), values / "evil.distcp")
    size = (values / "evil.distcp").stat().st_size
    lr = next(k for k in metadata.storage_data if k.fqn.endswith("param_groups.0.lr"))
    storage = dict(metadata.storage_data)
    storage[lr] = dataclasses.replace(storage[lr], relative_path="evil.distcp", offset=0, length=size)
    with open(values / ".metadata", "wb") as f:
        pickle.dump(dataclasses.replace(metadata, storage_data=storage), f)
    attempt("values", values)
finally:
    (out / "result.json").write_text(json.dumps(result))
    teardown()
