"""Every notebook's FULL profile, checked on a CPU before a GPU node runs it.

CI runs the smoke profile only; a full-profile value that the code rejects would stop a GPU job hours in.
For each notebook (not the student copies) the ``PROFILES = {...}`` statement is found with ``ast`` and run
after the notebook's ``setup`` cell only (nothing else of the notebook runs but the plain assignments before
the statement in its cell, which it may read, e.g. ``GPUS = ...``), with ``torch.cuda.device_count``
answering 1, 2, 4 and 8 (the GPU nodes the full profile runs on). Each value the later cells hand to the
library is then checked with the same functions or constructors those cells call (the scripts' own
``parse_args``/``why_invalid``/``plan``, ``TrainConfig``, ``Recipe``, ``why_invalid`` of the grid, ...); where
the value depends on the GPU count, what the notebook then does is asserted for each count: it runs, or it
refuses at setup with a reason (the table ``REFUSED``), never a crash later. Nothing is trained, launched or
instantiated at full size (``meta`` tensors where a shape matters).
"""
from __future__ import annotations

import ast
import contextlib
import copy
import dataclasses
import importlib.util
import inspect
import io
import json
import sys
import types
import warnings
from pathlib import Path
from unittest import mock

import pytest
import torch

from dlo.course.notebooks import profile_differences
from dlo.measure import torch_threads

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("*/*.ipynb") if "student" not in p.parts)
GPU_COUNTS = (1, 2, 4, 8)


# ----------------------------------------------------------------------------------------------------
# Loading PROFILES the way the notebook defines it (setup cell + the PROFILES statement, nothing else)
# ----------------------------------------------------------------------------------------------------
def _sources(nb: str) -> tuple[str, str, str]:
    """(setup cell, preamble, PROFILES statement): the preamble is the plain assignments that come before
    ``PROFILES = {...}`` in its cell (e.g. ``GPUS = torch.cuda.device_count()``), which the statement reads."""
    cells = json.loads((ROOT / nb).read_text())["cells"]
    setup = next((c for c in cells if "setup" in c.get("metadata", {}).get("tags", [])), None)
    for cell in cells:
        if cell["cell_type"] != "code":
            continue
        src = "".join(cell["source"])
        if "PROFILES" not in src:
            continue
        preamble = []
        for node in ast.parse(src).body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "PROFILES" for t in node.targets):
                return ("".join(setup["source"]) if setup else ""), "\n".join(preamble), ast.get_source_segment(src, node)
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                preamble.append(ast.get_source_segment(src, node))
    raise AssertionError(f"{nb}: no `PROFILES = {{...}}` statement in a code cell")


_SETUP: dict[str, dict] = {}
_PROFILES: dict[tuple[str, int], dict] = {}


def load_profiles(nb: str, gpus: int) -> dict:
    """The notebook's PROFILES dict as a node with ``gpus`` GPUs builds it (cached: tests may monkeypatch it)."""
    if (nb, gpus) not in _PROFILES:
        setup, preamble, statement = _sources(nb)
        if nb not in _SETUP:
            g: dict = {"__name__": "__profiles__"}
            exec(compile(setup, f"{nb}:setup", "exec"), g)
            _SETUP[nb] = g
        g = dict(_SETUP[nb], profile="full")  # the parameters cell's `profile`, as a full run sets it
        with mock.patch("torch.cuda.device_count", return_value=gpus):
            exec(compile(preamble, f"{nb}:before PROFILES", "exec"), g)
            exec(compile(statement, f"{nb}:PROFILES", "exec"), g)
        _PROFILES[(nb, gpus)] = g["PROFILES"]
    return _PROFILES[(nb, gpus)]


@pytest.fixture(scope="module", autouse=True)
def _runs_dir(tmp_path_factory):
    with mock.patch.dict("os.environ", {"DLO_RUNS_DIR": str(tmp_path_factory.mktemp("runs"))}):
        yield


def _script(path: str) -> types.ModuleType:
    """A course script (``tp_pipeline/pipeline_train.py``, ...) imported as a module: its checks, not its main."""
    name = "_fullprof_" + path.replace("/", "_").removesuffix(".py")
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


# ----------------------------------------------------------------------------------------------------
# Report: problems (would crash), refusals (the notebook stops at setup with a reason), skips (with a reason)
# ----------------------------------------------------------------------------------------------------
class Report:
    def __init__(self, nb: str):
        self.nb, self.problems, self.refused, self.skipped = nb, [], {}, []
        self.guards: set[tuple[int, str]] = set()  # the (least, what) of the check_processes guard the test assumes

    def problem(self, key: str, gpus: int | None, what: str) -> None:
        where = "any GPU count" if gpus is None else f"{gpus} GPU(s)"
        label = "PROFILES['dry']" if key == "dry" else f"full[{key!r}]"
        entry = (key, gpus, f"{self.nb}: {label} on {where}: {what}")
        if entry not in self.problems:
            self.problems.append(entry)

    def call(self, key: str, gpus: int | None, fn, *args, **kwargs):
        """``fn(*args, **kwargs)``; an exception is a problem (its first line), None returned."""
        try:
            with contextlib.redirect_stderr(io.StringIO()) as err:
                return fn(*args, **kwargs)
        except SystemExit as exc:  # argparse: the script's own parser refuses an argument
            lines = [line for line in err.getvalue().splitlines() if line.strip()]
            self.problem(key, gpus, f"the script's parser exits ({exc.code}): {lines[-1] if lines else ''}")
            return None
        except Exception as exc:  # noqa: BLE001 - any exception here is what the GPU job would die of
            self.problem(key, gpus, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            return None

    def require(self, ok: bool, key: str, gpus: int | None, what: str) -> bool:
        if not ok:
            self.problem(key, gpus, what)
        return ok


def _full(nb: str, gpus: int) -> dict:
    return load_profiles(nb, gpus)["full"]


def _positive_ints(rep: Report, key: str, values, gpus=None) -> None:
    ok = isinstance(values, (list, tuple)) and len(values) > 0 and all(
        isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values)
    rep.require(ok, key, gpus, f"must be a non-empty list of positive integers, got {values!r}")


def _positive_numbers(rep: Report, key: str, values, gpus=None) -> None:
    ok = isinstance(values, (list, tuple)) and len(values) > 0 and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in values)
    rep.require(ok, key, gpus, f"must be a non-empty list of positive numbers, got {values!r}")


def _meta_params(build) -> int:
    """Parameters of the model ``build()`` makes, on the meta device (no memory, no init cost)."""
    with torch.device("meta"):
        return sum(p.numel() for p in build().parameters())


def _gpu_per_process(rep: Report, key: str, nproc: int, gpus: int) -> None:
    """``nproc`` processes of ``launch`` on a node of ``gpus`` GPUs: each rank picks its GPU with
    ``dlo.runtime.distributed._cuda_index`` (what ``init_distributed`` does); NCCL needs one GPU per rank."""
    from dlo.runtime.distributed import _cuda_index

    owners = []
    with mock.patch("torch.cuda.device_count", return_value=gpus):
        for rank in range(nproc):
            index = rep.call(key, gpus, _cuda_index, types.SimpleNamespace(local_rank=rank), torch.device("cuda"))
            if index is None:
                return
            owners.append(index)
    rep.require(len(set(owners)) == nproc, key, gpus,
                f"{nproc} processes on {gpus} GPU(s) share GPU {owners[0]} (ranks get GPUs {owners}): NCCL refuses "
                "two ranks of one communicator on the same GPU")


def _launch(rep: Report, key: str, gpus: int, script: str, args, nproc: int, timeout_s) -> None:
    """What ``dlo.runtime.launch(script, args, nproc=..., timeout_s=...)`` checks before starting anything, then
    which GPU each of its ranks would take."""
    from dlo.runtime.launch import _check_request

    if rep.call(key, gpus, _check_request, ROOT / script, [str(a) for a in args], nproc, timeout_s) is not None:
        _gpu_per_process(rep, key, nproc, gpus)


def _guard(rep: Report, gpus: int, nprocs, least: int, what: str) -> bool:
    """The notebook's setup guard, ``dlo.runtime.check_processes(nprocs, device, least=..., what=...)``, on a node of
    ``gpus`` GPUs: too few processes, or more processes than GPUs, is a refusal (one line, before anything runs)."""
    from dlo.runtime import check_processes

    rep.guards.add((least, what))
    try:
        check_processes(nprocs, "cuda", least=least, what=what, gpus=gpus)
    except ValueError as exc:
        rep.refused[gpus] = str(exc)
        return False
    return True


# ----------------------------------------------------------------------------------------------------
# One validator per notebook: what its later cells do with each full-profile value
# ----------------------------------------------------------------------------------------------------
def v_jour1(rep: Report, nb: str) -> None:
    from dlo.models import resnet18_cifar

    S = _full(nb, 8)
    _positive_ints(rep, "sweep", S["sweep"])
    # largest_batch (the exercise) stops at the first out-of-memory batch: sizes must grow, or some are never tried
    rep.require(list(S["sweep"]) == sorted(set(S["sweep"])), "sweep", None,
                f"must be increasing (the sweep stops at the first batch that does not fit), got {S['sweep']}")
    for key in ("batch_size", "profile_batch", "train_batch", "train_epochs", "n_batches", "repeats", "baseline_repeats"):
        _positive_ints(rep, key, [S[key]])
    rep.call("train_width", None, _meta_params, lambda: resnet18_cifar(width=S["train_width"]))


def v_shapes(rep: Report, nb: str) -> None:
    from dlo.models import resnet18_cifar

    S = _full(nb, 8)
    _positive_ints(rep, "sweep", S["sweep"])
    smoke = load_profiles(nb, 8)["smoke"]
    for key in ("linear", "conv", "stem", "resnet"):
        rep.require(isinstance(S[key], dict) and set(S[key]) == set(smoke[key]), key, None,
                    f"must be a dict with the keys {sorted(smoke[key])} (the cells index them), got {S[key]!r}")
        _positive_ints(rep, key, list(S[key].values()))
    w = S["waves"]
    if w is not None and rep.require(isinstance(w, dict) and set(w) == {"start", "stop", "step", "k"}, "waves", None,
                                     f"must be None or a dict start/stop/step/k, got {w!r}"):
        rep.require(0 < w["start"] < w["stop"] and w["step"] > 0 and w["k"] > 0, "waves", None,
                    f"needs 0 < start < stop, step > 0, k > 0 (a non-empty sweep), got {w!r}")
    rep.call("resnet", None, _meta_params, lambda: resnet18_cifar(width=S["resnet"]["width"]))


def v_augment(rep: Report, nb: str) -> None:
    from dlo.training import TrainConfig

    S = _full(nb, 8)
    rep.call("epochs", None, TrainConfig, epochs=S["epochs"], lr=S["lr"])
    rep.require(S["n_train"] + S["n_val"] <= 50000, "n_train", None,
                f"n_train + n_val = {S['n_train'] + S['n_val']} is more than CIFAR-10's 50 000 training images")


def v_dataloader(rep: Report, nb: str) -> None:
    from dlo import data

    S = _full(nb, 8)
    workers = S["workers"]
    if rep.require(isinstance(workers, list) and workers and all(isinstance(w, int) and w >= 0 for w in workers),
                   "workers", None, f"must be a non-empty list of integers >= 0, got {workers!r}"):
        rep.require(0 in workers, "workers", None, "must keep 0 (the baseline every other count is compared with)")
        with warnings.catch_warnings():  # "more workers than this CPU's cores": true here, not on a GPU node
            warnings.simplefilter("ignore")
            for w in workers:  # the loader the notebook's trials build (nothing iterated: no worker starts)
                rep.call("workers", None, data.make_loader, list(range(8)), 4, num_workers=w)


def v_ddp(rep: Report, nb: str) -> None:
    ddp_train = _script("Jour2/ddp_train.py")
    for gpus in GPU_COUNTS:
        S = _full(nb, gpus)
        if _guard(rep, gpus, S["nproc"], 2, "DDP"):
            common = ["--width", S["width"], "--n-train", S["n_train"], "--max-steps", S["max_steps"],
                      "--warmup-steps", S["warmup_steps"]]
            _launch(rep, "nproc", gpus, "Jour2/ddp_train.py", common, S["nproc"], S["timeout_s"])
            rep.call("per_rank_batch", gpus, ddp_train.parse_args,
                     [str(a) for a in common + ["--global-batch", S["per_rank_batch"] * S["nproc"]]])
    S = _full(nb, 8)
    _positive_numbers(rep, "bucket_caps", S["bucket_caps"])
    runs = [{"name": f"bucket_cap_mb={cap:g}", "comm_view": True, "bucket_cap_mb": cap} for cap in S["bucket_caps"]]
    args = rep.call("bucket_caps", None, ddp_train.parse_args, ["--runs", json.dumps(runs)])
    if args is not None:
        from dlo.runtime.launch_request import expand_runs
        rep.call("bucket_caps", None, expand_runs, args, args.runs)


def v_dp_scratch(rep: Report, nb: str) -> None:
    script = _script("Jour2/dp_scratch_train.py")
    for gpus in GPU_COUNTS:
        S = _full(nb, gpus)
        if _guard(rep, gpus, S["nprocs"], 2, "data parallelism"):
            for n in S["nprocs"]:
                _launch(rep, "nprocs", gpus, "Jour2/dp_scratch_train.py", [], n, S["timeout_s"])
    S = _full(nb, 8)
    _positive_numbers(rep, "bucket_mb", S["bucket_mb"])
    _positive_ints(rep, "hidden", S["hidden"])
    argv = ["--image-size", S["image_size"], "--hidden", ",".join(map(str, S["hidden"])), "--per-rank-batch",
            S["per_rank_batch"], "--bucket-mb", ",".join(f"{mb:g}" for mb in S["bucket_mb"]), "--accum", S["accum"],
            "--accum-bucket-mb", S["accum_bucket_mb"], "--gantt-bucket-mb", S["gantt_bucket_mb"], "--repeats",
            S["repeats"], "--warmup-max-calls", S["warmup_max_calls"], "--gantt-steps", S["gantt_steps"]]
    args = rep.call("bucket_mb", None, script.parse_args, [str(a) for a in argv])
    if args is not None:
        rep.call("hidden", None, _meta_params, lambda: script.make_model(args, 0, torch.device("meta")))


def v_jit(rep: Report, nb: str) -> None:
    S = _full(nb, 8)
    # the cell builds resnet18_cifar(width=64) for "resnet18" and the MLP for anything else: a typo silently
    # measures the MLP
    rep.require(S["train_model"] in ("mlp", "resnet18"), "train_model", None,
                f"must be 'mlp' or 'resnet18', got {S['train_model']!r}")


def v_optimizers(rep: Report, nb: str) -> None:
    from dlo.training import TrainConfig

    S = _full(nb, 8)
    rep.call("epochs", None, TrainConfig, epochs=S["epochs"])
    _positive_ints(rep, "batch", [S["batch"], S["large_batch"]])
    rep.require(S["n_train"] + S["n_val"] <= 50000, "n_train", None,
                f"n_train + n_val = {S['n_train'] + S['n_val']} is more than CIFAR-10's 50 000 training images")


def v_recipes(rep: Report, nb: str) -> None:
    from dlo.training import TrainConfig

    S = _full(nb, 8)
    first = S["batches"][0][1]
    rep.call("resize", None, TrainConfig, epochs=S["epochs"], lr=S["lr"], resize_schedule=S["resize"])
    rep.call("batches", None, TrainConfig, epochs=S["epochs"], lr=S["lr"] * first / S["batch"],
             batch_schedule=S["batches"], scale_lr_with_batch=True)
    rep.call("ema_decay", None, TrainConfig, epochs=S["epochs"], lr=S["lr"] * first / S["batch"],
             resize_schedule=S["resize"], batch_schedule=S["batches"], scale_lr_with_batch=True, label_smoothing=0.1,
             ema_decay=S["ema_decay"], tta=True)
    for key in ("resize", "batches"):
        late = [e for e, _ in S[key] if e >= S["epochs"]]
        rep.require(not late, key, None, f"changes at epoch(s) {late}, never reached in {S['epochs']} epochs")


def v_transfer(rep: Report, nb: str) -> None:
    S = _full(nb, 8)
    # the pretrained cell raises unless width is 64 (torchvision's ResNet-18 weights)
    rep.require(S["width"] == 64, "width", None, f"torchvision's ResNet-18 weights need width 64, got {S['width']}")


def v_cifar_race(rep: Report, nb: str) -> None:
    from dlo.lessons import race

    S = _full(nb, 8)
    for key in ("reference", "baseline"):
        recipe = S[key]
        if not rep.require(isinstance(recipe, race.Recipe), key, None, f"must be a race.Recipe, got {type(recipe)}"):
            continue
        rep.call(key, None, dataclasses.replace, recipe)  # Recipe.__post_init__'s checks again
        rep.call(key, None, race._check_args, recipe, S["target"], S["baseline_budget_s"])
        rep.call(key, None, _meta_params, lambda: race.MODELS[recipe.model](num_classes=10, width=recipe.width))
        rep.require(recipe.amp in (None, "bf16", "fp16"), key, None, f"amp {recipe.amp!r} is not None/bf16/fp16")
    rep.require(0 < S["n_val"] < 50000, "n_val", None, f"held-out images must be in (0, 50000), got {S['n_val']}")


def v_hpo(rep: Report, nb: str) -> None:
    from dlo.lessons import hpo
    from dlo.measure import bench

    S = _full(nb, 8)
    for key in ("cifar", "tune"):
        kw = {k: v for k, v in S[key].items() if k not in ("n_train", "n_val")}
        sig = inspect.signature(hpo.Trainer)
        rep.call(key, None, sig.bind, {"lr": 0.05}, {}, device="cpu", seed=0, **kw)
        rep.require(S[key]["n_train"] + S[key]["n_val"] <= 50000, key, None,
                    f"n_train + n_val = {S[key]['n_train'] + S[key]['n_val']} is more than CIFAR-10's 50 000")

    def threads():  # the notebook's `with torch_threads(S["threads"]):` around every training
        with torch_threads(S["threads"]):
            pass

    rep.call("threads", None, threads)
    rep.require(S["ray_cpus"] is None or (isinstance(S["ray_cpus"], int) and S["ray_cpus"] > 0), "ray_cpus", None,
                f"must be None (all cores) or a positive integer, got {S['ray_cpus']!r}")
    res = S["ray_resources"]
    if rep.require(isinstance(res, dict) and set(res) <= {"cpu", "gpu"} and all(
            isinstance(v, (int, float)) and v > 0 for v in res.values()), "ray_resources", None,
            f"must map 'cpu'/'gpu' to positive numbers (Tune's per-trial resources), got {res!r}"):
        gpu = res.get("gpu", 0)
        rep.require(gpu <= 1 or float(gpu).is_integer(), "ray_resources", None,
                    f"Ray takes a fraction of one GPU or whole GPUs per trial, got gpu={gpu}")
        for gpus in GPU_COUNTS:  # ray_start(num_gpus=device_count): a trial asking for more never starts
            rep.require(gpu <= gpus, "ray_resources", gpus, f"a trial asks for {gpu} GPUs: Tune would wait forever")


def v_inference(rep: Report, nb: str) -> None:
    from dlo.models import small
    from dlo.models.config import TransformerConfig
    from dlo.models.llama import Llama

    S = _full(nb, 8)
    _positive_numbers(rep, "temperatures", S["temperatures"])
    sp = S["sparsities"]
    rep.require(all(0.0 <= s < 1.0 for s in sp) and list(sp) == sorted(set(sp)), "sparsities", None,
                f"must be increasing fractions in [0, 1) (prune.l1_unstructured's amount), got {sp!r}")
    rep.require(set(S["finetune_at"]) <= set(sp), "finetune_at", None,
                f"{sorted(set(S['finetune_at']) - set(sp))} not among the pruned sparsities {sp}")
    _positive_ints(rep, "mlp_hidden", S["mlp_hidden"])
    _positive_ints(rep, "contexts", S["contexts"])
    cfg = S["llama"]
    if rep.require(isinstance(cfg, TransformerConfig), "llama", None, f"must be a TransformerConfig, got {cfg!r}"):
        rep.call("llama", None, dataclasses.replace, cfg)
        rep.call("llama", None, _meta_params, lambda: Llama(cfg, seed=0))
        # the generation section's Hugging Face model (its rotary embeddings take any position: the longest
        # context + 1 may pass max_position_embeddings without an error)
        rep.call("llama", None, cfg.to_hf, bos_token_id=None, eos_token_id=None)
    rep.call("mlp_hidden", None, _meta_params, lambda: small.MLP(hidden=S["mlp_hidden"]))


def v_llm_memory(rep: Report, nb: str) -> None:
    from dlo.measure import memory as M
    from dlo.models.config import TransformerConfig
    from dlo.models.llama import Llama

    S = _full(nb, 8)
    cfg = S["measure_cfg"]
    if rep.require(isinstance(cfg, TransformerConfig), "measure_cfg", None, f"must be a TransformerConfig, got {cfg!r}"):
        rep.call("measure_cfg", None, dataclasses.replace, cfg)
        n = rep.call("measure_cfg", None, _meta_params, lambda: Llama(cfg, seed=0))
        counted = rep.call("measure_cfg", None, M.count_parameters, cfg)
        if n is not None and counted is not None:
            rep.require(counted["total"] == n, "measure_cfg", None,
                        f"count_parameters says {counted['total']:,}, the model has {n:,}")


def v_apis(rep: Report, nb: str) -> None:
    from dlo.lessons import apis
    from dlo.runtime.validate import check_batch_divisible

    for gpus in GPU_COUNTS:
        S = _full(nb, gpus)
        rep.require(S["model"] in apis.MODELS, "model", gpus, f"unknown model {S['model']!r}: {sorted(apis.MODELS)}")
        rep.require(S["fp8"]["model"] in apis.MODELS, "fp8", gpus, f"unknown model {S['fp8']['model']!r}")
        if not _guard(rep, gpus, S["nproc"], 2, "sharded training"):
            continue
        rep.call("global_batch", gpus, check_batch_divisible, S["global_batch"], S["nproc"])
        _launch(rep, "nproc", gpus, "tp_fsdp/apis_train.py", ["--model", S["model"]], S["nproc"], S["timeout_s"])
        for api, strategy in S["runs"]:  # the notebook's run(): deepspeed-<stage> split, then the same calls
            stage = None
            if strategy.startswith("deepspeed-"):
                strategy, stage = "deepspeed", int(strategy.split("-")[1])
            rep.call("runs", gpus, apis.unavailable_reason, api, strategy, "cuda")
            if api == "accelerate":
                rep.call("runs", gpus, apis.accelerate_config, strategy, S["nproc"], cpu=False, zero_stage=stage or 3)


def v_experts(rep: Report, nb: str) -> None:
    from dlo.parallel import experts as X

    for gpus in GPU_COUNTS:
        S = _full(nb, gpus)
        if not isinstance(S["nproc"], int) or S["nproc"] < 2 or S["experts"] % S["nproc"]:
            rep.problem("nproc", gpus, f"the setup cell raises: nproc must be >= 2 and divide {S['experts']} experts")
            continue
        if not _guard(rep, gpus, S["nproc"], 2, "expert parallelism"):
            continue
        args = ["--configs", f"{S['experts']}:{S['top_k']}:none,{S['experts']}:{S['top_k']}:1.0", "--hidden",
                S["hidden"], "--inter", S["inter"], "--batch-per-rank", S["batch_per_rank"], "--seq", S["seq"]]
        _launch(rep, "nproc", gpus, "lib/dlo/parallel/experts_worker.py", args, S["nproc"], S["timeout_s"])
    S = _full(nb, 8)
    rep.require(0 < S["top_k"] <= S["experts"], "top_k", None, f"top_k {S['top_k']} not in 1..{S['experts']}")
    _positive_numbers(rep, "capacity_factors", S["capacity_factors"])
    for cf in S["capacity_factors"]:
        rep.call("capacity_factors", None, X.capacity, S["tokens"], S["experts"], S["top_k"], cf)
        rep.call("capacity_factors", None, _meta_params,
                 lambda: X.MoEFeedForward(S["hidden"], S["inter"], S["experts"], S["top_k"], capacity_factor=cf, seed=0))


def v_fsdp(rep: Report, nb: str) -> None:
    from dlo.data import tokens
    from dlo.measure import memory
    from dlo.parallel import fsdp as ref
    from dlo.runtime.launch_request import expand_runs

    script = _script("tp_fsdp/fsdp_train.py")
    cfg = rep.call("model", None, ref.model_config, _full(nb, 8)["model"])
    if cfg is not None:
        rep.call("model", None, memory.count_parameters, cfg)
    for gpus in GPU_COUNTS:
        S = _full(nb, gpus)
        if not _guard(rep, gpus, S["nproc"], 1, "FSDP"):
            continue
        P, n = S["precision"], S["nproc"]
        rep.call("precision", gpus, script.mixed_precision_policy, P)
        runs = ([{"name": "0 DDP", "strategy": "ddp"}, {"name": "3", "strategy": "fsdp", "precision": P,
                                                        "checkpointing": True}]
                + [{"name": f"8 ZeRO-{z}", "strategy": f"zero{z}", "precision": P} for z in (1, 2, 3)]
                + [{"name": f"sweep {s} b{b}", "strategy": s, "precision": P if s != "ddp" else "fp32",
                    "global_batch": b * n} for s in ("ddp", "fsdp") for b in S["sweep"]]
                + [{"name": f"prefetch: {m}", "prefetch": m, "strategy": "fsdp", "precision": P,
                    "global_batch": S["prefetch_per_rank_batch"] * n, "timed_repeats": S["prefetch_repeats"],
                    "warmup_max_calls": S["prefetch_warmup_max"]} for m in ref.PREFETCH_MODES])
        argv = ["--model", S["model"], "--seq-len", str(S["seq_len"]), "--steps", str(S["steps"]), "--warmup-steps",
                str(S["warmup_steps"]), "--global-batch", str(S["global_batch"]), "--runs", json.dumps(runs)]
        args = rep.call("model", gpus, script.parse_args, argv)
        if args is None:
            continue
        _launch(rep, "nproc", gpus, "tp_fsdp/fsdp_train.py", argv, n, S["timeout_s"])
        for name, a in rep.call("sweep", gpus, expand_runs, args, args.runs) or []:
            key = "sweep" if name.startswith("sweep") else "precision"
            rep.call(key, gpus, tokens.per_rank_batch, a.global_batch, n)
            if a.strategy.startswith("zero"):
                rep.call(key, gpus, script.deepspeed_config, int(a.strategy[-1]), a.global_batch, n, a.precision)
            rep.require(not (a.strategy == "ddp" and a.precision != "fp32"), key, gpus,
                        f"{name}: the script runs DDP in fp32 only")
        # the levers' launch (one more lever per run), as the notebook builds it, compile included (a GPU node)
        one_batch = S["levers_micro_batch"] * n
        accum = dict(grad_accum=S["levers_accum"], global_batch=one_batch * S["levers_accum"],
                     accum_sync="every" if n == 1 else "last")
        chunked = dict(loss="chunked", loss_chunk_tokens=S["levers_chunk_tokens"])
        levers = [dict(checkpointing="full", global_batch=one_batch),
                  dict(checkpointing="full", global_batch=one_batch, optimizer_impl="fused"),
                  dict(checkpointing="full", optimizer_impl="fused", **accum),
                  dict(checkpointing="full", optimizer_impl="fused", **accum, **chunked),
                  dict(checkpointing="selective", optimizer_impl="fused", **accum, **chunked),
                  dict(checkpointing="selective", optimizer_impl="fused", compile=True, **accum, **chunked),
                  dict(checkpointing="none", optimizer_impl="fused", compile=True, **accum, **chunked)]
        lever_runs = [{"name": f"L{i}", "strategy": "fsdp", "precision": P, "seq_len": S["seq_len"],
                       "steps": S["levers_steps"], "warmup_steps": S["levers_warmup"], **r} for i, r in enumerate(levers)]
        argv = ["--model", S["model"], "--seq-len", str(S["seq_len"]), "--steps", str(S["steps"]), "--warmup-steps",
                str(S["warmup_steps"]), "--runs", json.dumps(lever_runs)]
        args = rep.call("levers_accum", gpus, script.parse_args, argv)
        for name, a in (rep.call("levers_accum", gpus, expand_runs, args, args.runs) or []) if args else []:
            rep.call("levers_accum", gpus, tokens.per_rank_batch, a.global_batch, n * a.grad_accum)
            rep.require(a.loss_chunk_tokens <= a.seq_len * a.global_batch // n, "levers_chunk_tokens", gpus,
                        f"{name}: a loss chunk larger than a rank's tokens")


def v_grid(rep: Report, nb: str) -> None:
    from dlo.models.config import TransformerConfig
    from dlo.parallel.grid_step import why_invalid
    from dlo.runtime import Grid

    grid_train = _script("tp_pipeline/grid_train.py")

    def config(S):
        return TransformerConfig(vocab_size=S["vocab"], hidden_size=S["hidden"], intermediate_size=S["intermediate"],
                                 num_layers=S["layers"], num_heads=S["heads"], num_kv_heads=S["kv_heads"],
                                 name="grid llama")

    for gpus in GPU_COUNTS:
        S = _full(nb, gpus)
        if not _guard(rep, gpus, S["nproc"], 2, "the 3D grid"):
            continue
        cfg = rep.call("layouts", gpus, config, S)
        if cfg is None:
            return
        run = []
        for layout in S["layouts"]:
            reason = rep.call("layouts", gpus, why_invalid, cfg, world_size=S["nproc"], batch=S["batch"],
                              micro_batches=S["micro_batches"], schedule="1f1b", **layout)
            if reason is None:
                run.append(layout)
                rep.call("layouts", gpus, Grid, S["nproc"], **layout)
                argv = [str(a) for a in ("--layers", S["layers"], "--hidden", S["hidden"], "--heads", S["heads"],
                                         "--kv-heads", S["kv_heads"], "--intermediate", S["intermediate"], "--vocab",
                                         S["vocab"], "--seq", S["seq"], "--batch", S["batch"], "--micro-batches",
                                         S["micro_batches"], "--steps", S["steps"], "--warmup-steps", S["warmup_steps"],
                                         "--dp", layout["dp"], "--pp", layout["pp"], "--tp", layout["tp"],
                                         "--schedules", "1f1b", "--compare")]
                rep.call("layouts", gpus, grid_train.parse_args, argv)
                _launch(rep, "nproc", gpus, "tp_pipeline/grid_train.py", argv, S["nproc"], S["timeout_s"])
            else:
                rep.skipped.append((gpus, layout, reason))
                if S["nproc"] == max(GPU_COUNTS):  # no node can run it: a dead entry of the profile
                    rep.problem("layouts", gpus, f"{layout} cannot run on the largest node: {reason}")
        if not run:
            rep.refused[gpus] = f"no layout of the profile runs on {S['nproc']} processes"


def v_pipeline(rep: Report, nb: str) -> None:
    from dlo.models.config import TransformerConfig

    script = _script("tp_pipeline/pipeline_train.py")
    schedules = ["naive", "afab", "1f1b", "interleaved", "torch_gpipe", "torch_1f1b", "deepspeed"]
    S = _full(nb, 8)
    rep.call("layers", None, TransformerConfig, vocab_size=S["vocab"], hidden_size=S["hidden"],
             intermediate_size=S["hidden"] * 8 // 3, num_layers=S["layers"], num_heads=S["heads"])
    ran, why_not = set(), {}  # micro-batch counts some schedule runs with, on some node; why the others do not
    for gpus in GPU_COUNTS:
        S = _full(nb, gpus)
        if not _guard(rep, gpus, S["nprocs"], 2, "a pipeline (one stage per process)"):
            continue
        runs_by_p = {}
        for n in S["nprocs"]:
            ms = S["micro_batches"] if n == min(S["nprocs"]) else [m for m in S["micro_batches"] if m >= n][-1:]
            argv = ["--layers", S["layers"], "--hidden", S["hidden"], "--heads", S["heads"], "--vocab", S["vocab"],
                    "--seq", S["seq"], "--batch", S["batch"], "--steps", S["steps"], "--warmup-steps",
                    S["warmup_steps"], "--schedules", *schedules, "--micro-batches", *ms]
            args = rep.call("micro_batches", gpus, script.parse_args, [str(a) for a in argv])
            if args is None:
                return
            _launch(rep, "nprocs", gpus, "tp_pipeline/pipeline_train.py", argv, n, S["timeout_s"])
            runs, skipped = script.plan(args, n)
            rep.skipped += [(gpus, r["schedule"], r["micro_batches"], r["skipped"]) for r in skipped]
            ran |= {m for s, m in runs if s != "naive"}
            why_not.update({r["micro_batches"]: r["skipped"] for r in skipped})
            runs_by_p[n] = runs
        # later cells look runs up with .iloc[-1]: an empty selection is an IndexError after the whole launch
        p_big = max(S["nprocs"])
        runs = runs_by_p[p_big]
        for name in ("naive", "afab", "1f1b", "interleaved"):  # the Gantt charts
            rep.require(any(s == name for s, _ in runs), "micro_batches", gpus,
                        f"no {name} run at p={p_big} (every m skipped): the Gantt cell fails")
        afab = [m for s, m in runs if s == "afab"]
        if afab:
            m_big = afab[-1]
            for name in ("afab", "1f1b", "interleaved"):  # the memory cell compares them at the same m
                rep.require((name, m_big) in runs, "micro_batches", gpus,
                            f"{name} does not run at m={m_big} (afab's largest m) on p={p_big}: "
                            f"{script.why_invalid(args, p_big, name, m_big)}")
        for n, r in runs_by_p.items():  # the comparison table with torch.distributed.pipelining
            rep.require(any(s == "torch_gpipe" for s, _ in r), "micro_batches", gpus,
                        f"no torch_gpipe run at p={n}: the comparison cell fails")
    for m in sorted(set(_full(nb, 8)["micro_batches"]) - ran):  # skipped by every schedule on every node
        rep.problem("micro_batches", None, f"m={m} never runs (every schedule skips it on every node): {why_not.get(m)}")


def v_attention(rep: Report, nb: str) -> None:
    from dlo.measure import memory
    from dlo.models.config import TransformerConfig
    from dlo.runtime import pick_device

    S = _full(nb, 8)
    dtype = getattr(torch, str(S["dtype"]), None)
    if rep.require(isinstance(dtype, torch.dtype) and dtype.is_floating_point, "dtype", None,
                   f"{S['dtype']!r} is not a floating torch dtype name (getattr(torch, name))"):
        rep.call("dtype", None, torch.empty, (), dtype=dtype, device="meta")
    rep.require(S["device"] in ("auto", "cuda") or str(S["device"]).startswith("cuda:"), "device", None,
                f"the full profile runs on a GPU: 'auto' or 'cuda', got {S['device']!r}")
    with mock.patch("torch.cuda.is_available", return_value=False):
        if S["device"] == "auto":
            rep.call("device", None, pick_device, S["device"])
    _positive_ints(rep, "seqs", S["seqs"])
    eager = [s for s in S["seqs"] if s <= S["eager_max_seq"]]
    if rep.require(bool(eager), "eager_max_seq", None, f"{S['eager_max_seq']} is below every length of {S['seqs']}"):
        cfg = rep.call("heads", None, TransformerConfig, vocab_size=8, hidden_size=S["heads"] * S["head_dim"],
                       intermediate_size=8, num_layers=1, num_heads=S["heads"], head_dim=S["head_dim"])
        if cfg is not None and dtype is not None:
            size = torch.empty((), dtype=dtype, device="meta").element_size()
            rep.call("heads", None, memory.activation_memory_per_token, cfg, dtype_bytes=size, flash_attention=True,
                     seq_len=max(eager))


def v_context_parallel(rep: Report, nb: str) -> None:
    from dlo.parallel import context as C

    S = _full(nb, 8)
    pairs = []
    for pair in str(S["heads"]).split(","):  # context_worker.main's parser (inline there: no library function)
        try:
            heads, kv_heads = (int(x) for x in pair.split(":"))
        except ValueError:
            rep.problem("heads", None, f"{pair!r} is not heads:kv_heads (e.g. '4:2'), in {S['heads']!r}")
            continue
        pairs.append((heads, kv_heads))
        if rep.require(heads > 0 and kv_heads > 0, "heads", None, f"{pair!r}: head counts must be positive"):
            rep.call("heads", None, C.repeat_kv, torch.empty(1, kv_heads, 1, 1, device="meta"), heads)
    for layout in ("balanced", "contiguous"):  # the worker's default --layouts
        rep.call("seq", None, C.chunk_len, S["seq"], S["nproc"], layout)
    _positive_ints(rep, "memory_seqs", S["memory_seqs"])
    rep.require(len(S["memory_seqs"]) >= 2, "memory_seqs", None, "the first cell compares the first two lengths")
    for seq in S["memory_seqs"]:
        for cp in (1, 2, 4):  # the memory cell slices seq // cp tokens per rank
            rep.require(seq % cp == 0, "memory_seqs", None, f"{seq} tokens do not split over cp={cp}")
    for gpus in GPU_COUNTS:
        S = _full(nb, gpus)
        if not _guard(rep, gpus, S["nproc"], 2, "the context-parallel ring"):
            continue
        _launch(rep, "nproc", gpus, "lib/dlo/parallel/context_worker.py",
                ["--seq", S["seq"], "--heads", S["heads"], "--causal", "1", "--torch-cp"], S["nproc"], S["timeout_s"])


def v_tensor_parallel(rep: Report, nb: str) -> None:
    from dlo.models.config import TransformerConfig

    script = _script("tp_tensor_parallel/tp_balises.py")
    for gpus in GPU_COUNTS:
        S = _full(nb, gpus)
        if not _guard(rep, gpus, S["nproc"], 2, "tensor parallelism"):
            continue
        m = S["model"]
        cfg = rep.call("model", gpus, TransformerConfig, vocab_size=m["vocab"], hidden_size=m["hidden"],
                       intermediate_size=m["intermediate"], num_layers=m["layers"], num_heads=m["heads"],
                       num_kv_heads=m["kv_heads"], name="workshop Llama")
        if cfg is None:
            return
        rep.call("dtype", gpus, lambda: torch.finfo(getattr(torch, S["dtype"])))
        args = rep.call("model", gpus, script.parse_args,
                        [a for k, v in m.items() for a in (f"--{k.replace('_', '-')}", str(v))]
                        + ["--steps", str(S["steps"]), "--warmup", str(S["warmup"]), "--dtype", S["dtype"]])
        if args is None:
            return
        plan = [(1, ["1x1"])] + [(n, [f"{n}x1"] + ([f"2x{n // 2}"] if n >= 4 else [])) for n in (2, 4, 8)
                                 if n <= S["nproc"]]
        sp = [n for n in S["sp_nproc"] if n <= S["nproc"]]
        for n, layouts in plan:
            _launch(rep, "nproc", gpus, "tp_tensor_parallel/tp_balises.py", ["--layouts", *layouts], n, S["timeout_s"])
            for layout in layouts:
                tp, dp = (int(v) for v in layout.split("x"))
                rep.call("model", gpus, script.dp_group_ranks, n, tp, dp)
                for what, value in (("num_heads", m["heads"]), ("num_kv_heads", m["kv_heads"]),
                                    ("intermediate_size", m["intermediate"]), ("vocab_size", m["vocab"])):
                    rep.call("model", gpus, script._divisible, what, value, tp, f"layout {layout}")
                rep.require(m["global_batch"] % dp == 0, "model", gpus,
                            f"global_batch {m['global_batch']} is not divisible by dp={dp} (layout {layout})")
        for n in sp:  # sequence parallelism: the sequence is cut in n, the model's heads too
            _launch(rep, "sp_nproc", gpus, "tp_tensor_parallel/tp_balises.py", ["--sp"], n, S["timeout_s"])
            for what, value in (("seq", m["seq"]), ("num_heads", m["heads"]), ("num_kv_heads", m["kv_heads"]),
                                ("intermediate_size", m["intermediate"]), ("vocab_size", m["vocab"])):
                rep.call("sp_nproc", gpus, script._divisible, what, value, n, "sequence parallelism")
        rep.require(not [n for n in S["sp_nproc"] if n < 2], "sp_nproc", gpus,
                    f"sequence parallelism needs >= 2 processes, got {S['sp_nproc']}")
        # the SP cell builds its table from the runs of sp_nproc <= nproc: none, and
        # pd.DataFrame([]).set_index(["tp", "version"]) raises KeyError after the earlier launches
        rep.require(bool(sp), "sp_nproc", gpus, f"no SP process count of {S['sp_nproc']} fits {S['nproc']} "
                    "process(es): the SP table is empty and its set_index raises KeyError")
        # the communication and DTensor tables keep tp > 1 runs only (launched for 2, 4, 8 <= nproc)
        rep.require(len(plan) > 1, "nproc", gpus, f"{S['nproc']} process(es): no tp > 1 layout runs, the "
                    "communication table is empty and the DTensor table's set_index('layout') raises KeyError")


VALIDATORS = {
    "Jour1/jour1.ipynb": v_jour1,
    "Jour1/shapes.ipynb": v_shapes,
    "Jour2/augment.ipynb": v_augment,
    "Jour2/dataloader.ipynb": v_dataloader,
    "Jour2/ddp.ipynb": v_ddp,
    "Jour2/dp_scratch.ipynb": v_dp_scratch,
    "Jour3/jit.ipynb": v_jit,
    "Jour3/optimizers.ipynb": v_optimizers,
    "Jour3/recipes.ipynb": v_recipes,
    "Jour3/transfer.ipynb": v_transfer,
    "Jour4/cifar_race.ipynb": v_cifar_race,
    "Jour4/hpo.ipynb": v_hpo,
    "Jour4/inference.ipynb": v_inference,
    "Jour4/llm_memory.ipynb": v_llm_memory,
    "tp_fsdp/apis.ipynb": v_apis,
    "tp_fsdp/experts.ipynb": v_experts,
    "tp_fsdp/fsdp.ipynb": v_fsdp,
    "tp_pipeline/grid.ipynb": v_grid,
    "tp_pipeline/pipeline.ipynb": v_pipeline,
    "tp_tensor_parallel/attention.ipynb": v_attention,
    "tp_tensor_parallel/context_parallel.ipynb": v_context_parallel,
    "tp_tensor_parallel/tensor_parallel.ipynb": v_tensor_parallel,
}

#: GPU counts at which the notebook's setup cell stops on purpose, with a one-line reason (not a crash).
REFUSED = {
    "Jour2/ddp.ipynb": {1},
    "Jour2/dp_scratch.ipynb": {1},
    "tp_pipeline/grid.ipynb": {1, 2, 4},  # every full layout is 8 GPUs
    "tp_pipeline/pipeline.ipynb": {1},
    "tp_fsdp/apis.ipynb": {1},  # two processes at least: one GPU cannot shard
    "tp_fsdp/experts.ipynb": {1, 2},  # 4 processes (2 of the 8 experts each)
    "tp_tensor_parallel/context_parallel.ipynb": {1, 2},  # a 4-process ring
    "tp_tensor_parallel/tensor_parallel.ipynb": {1},  # tp x dp layouts need 2 processes at least
}

#: Real full-profile values that would crash: (notebook, key, GPU count) -> what happens. Each is an xfail of
#: test_known_full_profile_crash (strict: it fails once fixed, so that the entry goes), and is left out of
#: test_full_profile.
KNOWN: dict[tuple[str, str, int], str] = {}


#: Shape differences between the smoke and full profiles that are the point, with the reason.
EXPECTED_DIFFERENCES = {("Jour4/hpo.ipynb", "ray_resources.gpu: in full only"):
                        "a Ray resource request: a GPU share only on a GPU node"}


def check(nb: str) -> Report:
    rep = Report(nb)
    for gpus in GPU_COUNTS:  # full has the shape of smoke (what CI runs): the same keys, nested, values of one kind
        prof = load_profiles(nb, gpus)
        for line in profile_differences(prof["smoke"], prof["full"]):
            if (nb, line) not in EXPECTED_DIFFERENCES:
                rep.problem(line.split(":")[0].split(".")[0], gpus, line)
        if "dry" in prof:  # the full profile rehearsed on a CPU: its overrides are full keys, of the same shape
            from dlo.course.notebooks import profile_settings

            rep.call("dry", gpus, profile_settings, prof, "dry")
            overridden = {k: v for k, v in prof["full"].items() if k in prof["dry"]}
            for line in profile_differences(overridden, prof["dry"], ("full", "dry")):
                rep.problem("dry", gpus, line)
    if not rep.problems:
        VALIDATORS[nb](rep, nb)
    return rep


_CHECKED: dict[str, Report] = {}


def checked(nb: str) -> Report:
    """``check(nb)`` of the profiles as the notebook defines them (computed once; tests that change a value call
    ``check`` itself)."""
    if nb not in _CHECKED:
        _CHECKED[nb] = check(nb)
    return _CHECKED[nb]


def _open(rep: Report) -> list[str]:
    return [msg for key, gpus, msg in rep.problems if (rep.nb, key, gpus) not in KNOWN]


# ----------------------------------------------------------------------------------------------------
# The tests
# ----------------------------------------------------------------------------------------------------
def test_every_notebook_has_a_validator():
    assert NOTEBOOKS, "no notebook found"
    missing = sorted(set(NOTEBOOKS) - set(VALIDATORS))
    assert not missing, f"notebook(s) without a full-profile validator in tests/test_full_profiles.py: {missing}"
    gone = sorted(set(VALIDATORS) - set(NOTEBOOKS))
    assert not gone, f"validator(s) for notebook(s) that no longer exist: {gone}"


@pytest.mark.parametrize("nb", NOTEBOOKS)
def test_full_profile(nb):
    if nb not in VALIDATORS:
        pytest.fail(f"{nb}: no full-profile validator (add one to VALIDATORS)")
    _assert_runs_or_refuses(checked(nb))


def _assert_runs_or_refuses(rep: Report) -> None:
    """No problem left (known ones aside), and refusals at exactly the GPU counts of ``REFUSED``."""
    nb = rep.nb
    problems = _open(rep)
    assert not problems, " | ".join(problems)
    refused = set(rep.refused)
    assert refused == REFUSED.get(nb, set()), (
        f"{nb}: the setup cell refuses the full profile on {sorted(refused)} GPU(s) "
        f"({'; '.join(f'{g}: {r}' for g, r in sorted(rep.refused.items()))}), expected {sorted(REFUSED.get(nb, set()))}")


@pytest.mark.parametrize("nb", NOTEBOOKS)
def test_the_guards_assumed_here_are_the_notebooks_own(nb):
    """The refusals above assume the notebook calls ``check_processes(..., least=L, what=W)`` before launching: it
    must, in its own code (a notebook without the guard would crash on those nodes instead of refusing)."""
    calls = set()
    for cell in json.loads((ROOT / nb).read_text())["cells"]:
        if cell["cell_type"] != "code":
            continue
        for node in ast.walk(ast.parse("".join(cell["source"]))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "check_processes":
                kw = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg in ("least", "what")}
                calls.add((kw.get("least", 1), kw.get("what", "this run")))
    assert checked(nb).guards <= calls, (f"{nb}: expected check_processes(..., least=L, what=W) for "
                                         f"{sorted(checked(nb).guards - calls)}, the notebook calls {sorted(calls)}")


@pytest.mark.parametrize("nb,key,gpus", sorted(KNOWN), ids=[f"{nb}-{key}-{g}gpu" for nb, key, g in sorted(KNOWN)])
def test_known_full_profile_crash(nb, key, gpus, request):
    request.applymarker(pytest.mark.xfail(reason=KNOWN[(nb, key, gpus)], strict=True))
    rep = checked(nb)
    hits = [msg for k, g, msg in rep.problems if (k, g) == (key, gpus)]
    assert not hits, " | ".join(hits)


# ----------------------------------------------------------------------------------------------------
# The checks can fail: a plausible bad full value, put into the loaded PROFILES dict, is caught
# ----------------------------------------------------------------------------------------------------
def _set_full(monkeypatch, nb: str, key: str, value) -> None:
    for gpus in GPU_COUNTS:
        monkeypatch.setitem(load_profiles(nb, gpus)["full"], key, copy.deepcopy(value))


def _problems_of(nb: str) -> list[str]:
    return _open(check(nb))


BAD_VALUES = [
    # interleaved 1F1B needs m % p == 0: at p=4, m=6 is skipped, yet the memory cell wants it at afab's largest m
    ("tp_pipeline/pipeline.ipynb", "micro_batches", [4, 6], "m=6 never runs"),
    # the bug the pipeline notebook once had: at p=8 the largest m (4) is not a multiple of 8, interleaved is skipped
    # there while the memory cell compares it with afab at that m
    ("tp_pipeline/pipeline.ipynb", "micro_batches", [2, 4], "interleaved does not run at m=4"),
    # a layout no node has (dp·pp·tp = 16 on an 8-GPU node)
    ("tp_pipeline/grid.ipynb", "layouts", [{"dp": 8, "pp": 1, "tp": 1}, {"dp": 4, "pp": 2, "tp": 2}],
     "cannot run on the largest node"),
    # an MLP width that tp=4 does not divide: the ParallelSwiGLU of the 4x1 layout would refuse it
    ("tp_tensor_parallel/tensor_parallel.ipynb", "model",
     dict(vocab=32000, hidden=2048, intermediate=5630, layers=8, heads=16, kv_heads=8, seq=1024, global_batch=8),
     "tp=4 does not divide intermediate_size=5630"),
    # 12 heads: tp=8 does not divide them (the 8x1 layout on an 8-GPU node)
    ("tp_tensor_parallel/tensor_parallel.ipynb", "model",
     dict(vocab=32000, hidden=1536, intermediate=5632, layers=8, heads=12, kv_heads=4, seq=1024, global_batch=8),
     "tp=8 does not divide num_heads=12"),
    ("tp_tensor_parallel/attention.ipynb", "dtype", "bf16", "is not a floating torch dtype name"),
    ("tp_tensor_parallel/context_parallel.ipynb", "heads", "4:4,6:4", "num_heads=6 must be a multiple"),
    ("Jour3/recipes.ipynb", "batches", [(0, 256), (5, 0)], "batch_schedule"),
    ("tp_fsdp/fsdp.ipynb", "precision", "fp16", "precision"),
    ("tp_fsdp/fsdp.ipynb", "model", "llama-3b", "model"),
    ("tp_fsdp/apis.ipynb", "runs", [("native", "fsdp"), ("accelerate", "deepspeed-4")], "zero_stage must be 2 or 3"),
    ("tp_fsdp/apis.ipynb", "runs", [("native", "fsdp"), ("lightning", "ddp")], "unknown API"),
    ("Jour4/hpo.ipynb", "ray_resources", {"cpu": 2, "gpu": 2}, "Tune would wait forever"),
    ("Jour3/jit.ipynb", "train_model", "resnet50", "must be 'mlp' or 'resnet18'"),
    ("Jour2/dataloader.ipynb", "workers", [0, 2, -1], "integers >= 0"),
    ("Jour4/inference.ipynb", "finetune_at", [0.7, 0.85], "not among the pruned sparsities"),
    ("tp_fsdp/experts.ipynb", "top_k", 9, "top_k 9 not in 1..8"),
]


@pytest.mark.parametrize("nb,key,value,expect", BAD_VALUES,
                         ids=[f"{nb}-{key}-{i}" for i, (nb, key, _, _) in enumerate(BAD_VALUES)])
def test_a_bad_full_value_is_caught(monkeypatch, nb, key, value, expect):
    _set_full(monkeypatch, nb, key, value)
    problems = _problems_of(nb)
    hits = [p for p in problems if f"full[{key!r}]" in p and expect in p]
    assert hits, f"{nb}: full[{key!r}] = {value!r} was not caught (expected {expect!r}); problems: {problems}"


def test_more_processes_than_gpus_is_a_refusal_on_those_nodes(monkeypatch):
    nb = "Jour2/dp_scratch.ipynb"
    for gpus in GPU_COUNTS:  # a world size of 8 added to the GPU count's: nodes of 2 or 4 GPUs refuse it
        monkeypatch.setitem(load_profiles(nb, gpus)["full"], "nprocs", sorted({gpus, 8}))
    rep = check(nb)
    assert sorted(rep.refused) == [1, 2, 4] and "8 processes but only 2 GPU(s)" in rep.refused[2], rep.refused
    with pytest.raises(AssertionError, match="refuses the full profile on \\[1, 2, 4\\] GPU"):
        _assert_runs_or_refuses(check(nb))


def test_a_dry_override_of_no_full_key_is_caught(monkeypatch):
    nb = "Jour2/ddp.ipynb"
    for gpus in GPU_COUNTS:
        monkeypatch.setitem(load_profiles(nb, gpus), "dry", {"max_step": 4})
    assert any("PROFILES['dry'] on 8 GPU(s)" in p and "max_step" in p for p in _problems_of(nb))


def test_a_full_only_key_is_caught(monkeypatch):
    nb = "Jour2/ddp.ipynb"
    for gpus in GPU_COUNTS:
        monkeypatch.setitem(load_profiles(nb, gpus)["full"], "find_unused", True)
    assert any("find_unused: in full only" in p for p in _problems_of(nb))


def test_a_changed_kind_in_full_or_in_a_dry_override_is_caught(monkeypatch):
    nb = "Jour4/hpo.ipynb"
    for gpus in GPU_COUNTS:
        prof = load_profiles(nb, gpus)
        monkeypatch.setitem(prof["full"], "workers", [4])  # a list where smoke has a number
        monkeypatch.setitem(prof["dry"], "cifar", {**prof["dry"]["cifar"], "width": "4"})  # a str where full has a number
        monkeypatch.setitem(prof["dry"], "tune", {"n_train": 256})  # a nested override missing keys full has
    problems = _problems_of(nb)
    assert any("workers: number in smoke, list in full" in p for p in problems)
    assert any("cifar.width: number in full, str in dry" in p for p in problems)
    assert any("tune.arch: in full only" in p for p in problems)


def test_a_bad_value_on_some_gpu_counts_only_names_them(monkeypatch):
    # 64 sequences over 3 FSDP ranks would not split; the profile scales global_batch with the GPUs, so force one
    nb = "tp_fsdp/apis.ipynb"
    for gpus in GPU_COUNTS:
        monkeypatch.setitem(load_profiles(nb, gpus)["full"], "global_batch", 12)
    problems = [p for p in _problems_of(nb) if "full['global_batch']" in p]
    assert any("on 8 GPU(s)" in p for p in problems) and not any("on 2 GPU(s)" in p for p in problems), problems
