"""The levers of a fast FSDP2 step (tp_fsdp/fsdp_train.py, dlo.parallel.fsdp): each one leaves the losses
and gradients of the run without it unchanged (fp32, same seed), and costs what the calculator says.

* chunked loss, activation checkpointing (full, selective, every k-th layer), gradient accumulation,
  AdamW's implementations: in this process against the plain computation;
* the same levers through ``fsdp_train.py --runs``, on 1 and on 2 gloo processes (FSDP2's
  ``set_requires_gradient_sync`` / ``set_reshard_after_backward``, DDP's ``no_sync``): loss trajectories
  equal to the run without the lever;
* memory: what selective checkpointing keeps and AdamW's step allocates, measured op by op
  (``TensorMemoryTracker``) against :mod:`dlo.measure.memory`, and the gpu-check configuration's prediction
  term by term;
* FLOPs: HFU counts the recomputed forwards, MFU does not.
"""
from __future__ import annotations

import importlib
import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

import dlo  # noqa: F401
from dlo.data import tokens
from dlo.measure import flops as F
from dlo.measure import memory as M
from dlo.models.config import LLAMA_3_2_3B
from dlo.parallel import fsdp
from dlo.runtime.launch import launch_forked

SCRIPT = Path(__file__).resolve().parents[1] / "tp_fsdp" / "fsdp_train.py"
CFG = fsdp.SMOKE_LLAMA
SEQ, BATCH = 32, 4


@pytest.fixture(scope="module")
def batch():
    dataset, _ = tokens.token_dataset(SEQ, vocab_size=CFG.vocab_size, n_sequences=32)
    return dataset, next(fsdp.batches(dataset, BATCH, 0, 1))


def _loss_and_grads(model, ids, labels):
    loss = fsdp.forward_loss(model, ids, labels)
    loss.backward()
    return loss.detach(), fsdp.full_gradients(model)


def _assert_same(a, b, rtol=1e-5, atol=1e-6):
    (la, ga), (lb, gb) = a, b
    torch.testing.assert_close(la, lb, rtol=rtol, atol=atol)
    assert sorted(ga) == sorted(gb)
    for k in ga:
        torch.testing.assert_close(ga[k], gb[k], rtol=rtol, atol=atol, msg=k)


# --------------------------------------------------------------------------------------------------
# In this process
# --------------------------------------------------------------------------------------------------

def test_full_loss_is_the_mean_cross_entropy(batch):
    _, (ids, labels) = batch
    model = fsdp.build_llama(CFG)
    torch.testing.assert_close(fsdp.forward_loss(model, ids, labels), fsdp.lm_loss(model(input_ids=ids).logits, labels))


@pytest.mark.parametrize("chunk", [32, 48, 128, 1000])  # divides, leaves a remainder, one chunk, more than all
def test_chunked_loss_equals_the_full_loss_and_its_gradients(batch, chunk):
    _, (ids, labels) = batch
    full = _loss_and_grads(fsdp.build_llama(CFG), ids, labels)
    model = fsdp.use_chunked_loss(fsdp.build_llama(CFG), chunk)
    assert model.lm_head.weight is model.model.embed_tokens.weight  # still tied, same parameter names
    _assert_same(_loss_and_grads(model, ids, labels), full)


def test_chunked_loss_never_holds_the_full_logits():
    # a vocabulary that dominates, as Llama 3's 128 k does: the loss's buffers make the peak
    cfg = M.TransformerConfig(vocab_size=8192, hidden_size=64, intermediate_size=128, num_layers=1, num_heads=4,
                              num_kv_heads=2, tie_embeddings=True)
    ids, labels = torch.randint(0, 8192, (4, 32)), torch.randint(0, 8192, (4, 32))
    n_tokens, peaks = ids.numel(), {}
    for chunk in (None, 16):
        model = fsdp.build_llama(cfg)
        if chunk:
            fsdp.use_chunked_loss(model, chunk)
        with M.TensorMemoryTracker(model) as tracker:
            fsdp.forward_loss(model, ids, labels).backward()
        peaks[chunk] = tracker.peak_bytes - tracker.baseline_bytes
    loss_buffers = 12 * n_tokens * cfg.vocab_size  # fp32 log-probabilities, their gradient, the logits' gradient
    assert loss_buffers <= peaks[None] <= 1.1 * loss_buffers
    assert peaks[16] < 0.6 * loss_buffers
    with pytest.raises(RuntimeError, match="needs labels"):
        fsdp.use_chunked_loss(fsdp.build_llama(cfg))(input_ids=ids)


@pytest.mark.parametrize("mode, every", [("full", 1), ("full", 2), ("selective", 1), ("selective", 2)])
def test_activation_checkpointing_modes_keep_loss_and_gradients(batch, mode, every):
    _, (ids, labels) = batch
    ref = _loss_and_grads(fsdp.build_llama(CFG), ids, labels)
    model = fsdp.apply_activation_checkpointing(fsdp.build_llama(CFG), mode, every=every)
    wrapped = [type(layer).__name__ == "CheckpointWrapper" for layer in fsdp.decoder_layers(model)]
    assert wrapped == [i % every == 0 for i in range(CFG.num_layers)]
    _assert_same(_loss_and_grads(model, ids, labels), ref)


def _saved_after_forward(model, ids, labels) -> int:
    """Bytes still held after forward (what backward needs), the model's own tensors excluded."""
    with M.TensorMemoryTracker(model) as tracker:
        loss = fsdp.forward_loss(model, ids, labels)
        held = tracker.current_bytes - tracker.baseline_bytes
    del loss
    return held


def test_selective_checkpointing_keeps_what_the_calculator_counts():
    cfg = M.TransformerConfig(vocab_size=64, hidden_size=128, intermediate_size=344, num_layers=3, num_heads=4,
                              num_kv_heads=2, tie_embeddings=True)
    ids = torch.randint(0, 64, (2, 64))
    labels = torch.randint(0, 64, (2, 64))
    n_tokens = ids.numel()
    held = {}
    for mode in ("none", "full", "selective"):
        model = fsdp.use_chunked_loss(fsdp.build_llama(cfg), 1 << 20)  # the loss saves only its chunk's input
        fsdp.apply_activation_checkpointing(model, mode)
        held[mode] = _saved_after_forward(model, ids, labels)
    per_layer = {mode: (held[mode] - held["full"]) / (n_tokens * cfg.num_layers) for mode in held}
    kept_full = cfg.hidden_size * 4  # fp32: each layer keeps its input
    want = M.selective_activation_per_token(cfg, 4) - kept_full
    assert per_layer["selective"] == pytest.approx(want, rel=0.1)
    assert held["full"] < held["selective"] < held["none"]


def test_gradient_accumulation_equals_the_whole_batch(batch):
    dataset, _ = batch
    runs = {}
    for accum in (1, 2, 4):
        model = fsdp.build_llama(CFG)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
        runs[accum] = fsdp.train_steps(model, opt, fsdp.batches(dataset, BATCH, 0, 1), 3, track_memory=False,
                                       grad_accum=accum)["losses"]
    assert runs[2] == pytest.approx(runs[1], rel=1e-5)
    assert runs[4] == pytest.approx(runs[1], rel=1e-5)
    with pytest.raises(ValueError, match="must divide"):
        fsdp.train_step(model, opt, *next(fsdp.batches(dataset, BATCH, 0, 1)), grad_accum=3)


def test_optimizer_implementations_agree(batch, monkeypatch):
    dataset, _ = batch
    runs = {}
    for impl in fsdp.OPTIMIZER_IMPLS:
        model = fsdp.build_llama(CFG)
        opt = fsdp.build_optimizer(model.parameters(), lr=3e-3, impl=impl)
        runs[fsdp.optimizer_impl(opt)] = fsdp.train_steps(model, opt, fsdp.batches(dataset, BATCH, 0, 1), 3,
                                                          track_memory=False)["losses"]
    assert sorted(runs) == ["for-loop", "foreach", "fused"]  # default is the for-loop on a CPU
    for impl in ("foreach", "fused"):
        assert runs[impl] == pytest.approx(runs["for-loop"], rel=1e-5)
    # a device without a fused kernel (as torch.optim checks it): one clear line
    monkeypatch.setattr(importlib.import_module("torch.optim.optimizer"), "_get_fused_kernels_supported_devices",
                        lambda: ["cuda"])
    with pytest.raises(ValueError, match="fused AdamW has no kernel for parameters on cpu .*--optimizer-impl foreach"):
        fsdp.build_optimizer(fsdp.build_llama(CFG).parameters(), lr=1e-3, impl="fused")


@pytest.mark.parametrize("impl", ["for-loop", "foreach", "fused"])
def test_adamw_step_temporaries_are_what_the_calculator_counts(impl):
    model = fsdp.build_llama(CFG)
    kwargs = {"foreach": {"foreach": True}, "fused": {"fused": True}, "for-loop": {"foreach": False}}[impl]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, **kwargs)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()  # creates the moments
    with M.TensorMemoryTracker(model, opt) as tracker:
        opt.step()
    extra = tracker.peak_bytes - tracker.baseline_bytes
    params = [p.numel() for p in model.parameters()]
    want = M.optimizer_step_temporaries(max(params), sum(params), impl)
    assert extra <= want + 4096 and extra >= 0.9 * want  # a few scalars (step counts) aside


def test_sdpa_backend_is_reported(batch):
    _, (ids, labels) = batch
    assert fsdp.sdpa_backends(lambda: fsdp.loss_sum(fsdp.build_llama(CFG), ids, labels)) == ["flash/cpu"]
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.MATH]):  # SDPA's composite fallback: matmuls and a softmax, no fused kernel
        assert fsdp.sdpa_backends(lambda: fsdp.loss_sum(fsdp.build_llama(CFG), ids, labels)) == ["math"]


def test_hfu_counts_the_recomputed_forwards_and_mfu_does_not():
    cfg, s = LLAMA_3_2_3B, 2048
    n = M.count_parameters(cfg)["non_embedding"]
    lhs = cfg.num_layers * cfg.q_dim * s
    assert F.flops_per_token(cfg, s) == 6 * n + 12 * lhs
    full = F.hardware_flops_per_token(cfg, s, recomputed_layers=cfg.num_layers)
    assert full == pytest.approx(8 * n + 16 * lhs, rel=1e-6)  # the final norm's 3,072 weights aside
    assert F.hardware_flops_per_token(cfg, s, recomputed_layers=0) == F.flops_per_token(cfg, s)
    assert fsdp.recomputed_layers(28, "full", 1) == 28
    assert fsdp.recomputed_layers(28, "full", 2) == 14
    assert fsdp.recomputed_layers(28, "full", 3) == 10  # layers 0, 3, ..., 27
    assert fsdp.recomputed_layers(28, "selective", 1) == 0
    assert fsdp.recomputed_layers(28, "none", 1) == 0
    out = fsdp.throughput(cfg, s, 2, 0.4, "cpu", precision="bf16", gpu_name="NVIDIA H100 80GB HBM3",
                          recomputed_layers=28)
    head = F.flops_per_token(cfg, s, include_head=True) - F.flops_per_token(cfg, s)
    assert out["mfu"] == pytest.approx(2 * s / 0.4 * F.flops_per_token(cfg, s, include_head=True) / 989e12)
    assert out["mfu_no_head"] == pytest.approx(2 * s / 0.4 * F.flops_per_token(cfg, s) / 989e12)
    assert out["hfu"] / out["mfu"] == pytest.approx((full + head) / (F.flops_per_token(cfg, s) + head))
    assert 1.25 < out["hfu"] / out["mfu"] < 8 / 6  # the head is not recomputed: a bit below no-head 4/3


# --------------------------------------------------------------------------------------------------
# The memory calculator on the gpu-check configuration
# --------------------------------------------------------------------------------------------------

#: one H100, Llama 3.2 3B, bf16, FSDP2 on 1 rank, 2 x 2048 tokens per micro-batch
GPU_CHECK = dict(batch=2, seq_len=2048, precision="bf16")


def test_measured_h100_peak_is_the_foreach_optimizer_step():
    """gpu-measurements/h100-2026-11-27: full checkpointing, full loss, torch's default AdamW (foreach on a
    GPU) peaked at 65.38 GB (max_memory_allocated). The peak is the optimizer step: 16 bytes/param of sharded
    state + foreach's fp32 copy of the parameters (sqrt of the second moment) = 64.25 GB, + the step's bf16
    logits that the training loop of that commit still held (4096 x 128256 x 2 = 1.05 GB) = 65.30 GB."""
    p = M.fsdp2_peak_memory(LLAMA_3_2_3B, 1, checkpointing="full", optimizer_impl="foreach", **GPU_CHECK)
    assert p["total"] == p["optimizer_step"] > p["forward_backward"]
    held_logits = 2 * 2048 * LLAMA_3_2_3B.vocab_size * 2
    assert (p["total"] + held_logits) / M.GB == pytest.approx(65.38, abs=0.15)
    fused = M.fsdp2_peak_memory(LLAMA_3_2_3B, 1, checkpointing="full", optimizer_impl="fused", **GPU_CHECK)
    assert fused["total"] == fused["forward_backward"] < p["total"]


def test_gpu_check_configuration_term_by_term():
    cfg = LLAMA_3_2_3B
    p = M.fsdp2_peak_memory(cfg, 1, checkpointing="selective", loss="chunked", loss_chunk_tokens=1024,
                            optimizer_impl="fused", grad_accum=8, accum_sync="every", **GPU_CHECK)
    # independent counts from the config
    h, v, L, i, q, kv = cfg.hidden_size, cfg.vocab_size, cfg.num_layers, cfg.intermediate_size, cfg.q_dim, cfg.kv_dim
    per_layer = 2 * h * q + 2 * h * kv + 3 * h * i + 2 * h
    n = v * h + L * per_layer + h
    assert n == 3_212_749_824
    t = 2 * 2048
    assert p["sharded_params_fp32"] == 4 * n and p["sharded_grads_fp32"] == 4 * n and p["adamw_states_fp32"] == 8 * n
    assert p["gathered_root"] == 2 * (v * h + h)
    assert p["gathered_layers"] == 2 * 2 * per_layer
    assert p["unsharded_layer_grads"] == (2 + 4) * per_layer
    assert p["head_grad"] == p["chunked_head_grad"] == 2 * v * h
    sac = 2 * (h + q + kv + kv + q + h + i + i + h) + 4 * cfg.num_heads
    assert p["activations"] == t * L * sac
    no_ckpt = 2 * (4 * h + 4 + 2 * h * 2) + 2 * (2 * q + 2 * kv) + 4 * cfg.num_heads + 4 * i * 2
    assert p["recompute"] == t * (no_ckpt - sac)
    assert p["final_norm"] == t * (4 * h + 4 + 2 * h * 2)
    assert p["loss_buffers"] == 1024 * v * 12
    assert p["accumulated_unsharded_grads"] == 0 and p["optimizer_temporaries"] == 0
    assert p["forward_backward"] == p["model_states"] + sum(p[k] for k in M.FSDP2_FORWARD_BACKWARD_TERMS)
    assert p["total"] == max(p["forward_backward"], p["optimizer_step"])
    assert 60 * M.GB < p["total"] < 70 * M.GB  # fits an 80 GB H100 with room for the allocator's cache
    last = M.fsdp2_peak_memory(cfg, 1, checkpointing="selective", loss="chunked", optimizer_impl="fused",
                               grad_accum=8, accum_sync="last", **GPU_CHECK)
    assert last["accumulated_unsharded_grads"] == 4 * n  # no_sync: the whole unsharded gradient, fp32
    assert last["total"] - p["total"] > 12 * M.GB  # 77 GB: why one GPU reduces after every micro-batch


# --------------------------------------------------------------------------------------------------
# Through fsdp_train.py, on 1 and 2 processes
# --------------------------------------------------------------------------------------------------

LEVER_RUNS = [
    {"name": "base"},
    {"name": "foreach", "optimizer_impl": "foreach"},
    {"name": "fused", "optimizer_impl": "fused"},
    {"name": "accum last", "grad_accum": 2},
    {"name": "accum every", "grad_accum": 2, "accum_sync": "every"},
    {"name": "accum kept", "grad_accum": 2, "accum_keep_gathered": True, "no_reshard": True},
    {"name": "full ckpt", "checkpointing": True},
    {"name": "ckpt every 2", "checkpointing": "full", "ac_every": 2},
    {"name": "selective", "checkpointing": "selective"},
    {"name": "chunked", "loss": "chunked", "loss_chunk_tokens": 48},
    {"name": "all", "optimizer_impl": "fused", "grad_accum": 2, "accum_sync": "every", "checkpointing": "selective",
     "loss": "chunked", "loss_chunk_tokens": 48},
    {"name": "ddp accum", "strategy": "ddp", "grad_accum": 2},
    {"name": "ddp base", "strategy": "ddp"},
]


@pytest.fixture(scope="module", params=[1, 2], ids=["1 process", "2 processes"])
def lever_records(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"levers{request.param}")
    args = ["--model", "smoke", "--seq-len", str(SEQ), "--global-batch", "4", "--steps", "3", "--warmup-steps", "1",
            "--runs", json.dumps(LEVER_RUNS)]
    recs = launch_forked(SCRIPT, args, nproc=request.param, records_dir=out, timeout_s=400,
                         env={"OMP_NUM_THREADS": "1"})
    return request.param, recs


def _mean_losses(recs, name):
    mine = [r for r in recs if r["run"] == name]
    assert mine and all(r["status"] == "ok" for r in mine), name
    return [sum(step) / len(step) for step in zip(*(r["losses"] for r in mine))]


@pytest.mark.parametrize("name", [r["name"] for r in LEVER_RUNS if r["name"] not in ("base", "ddp base")])
def test_each_lever_keeps_the_loss_trajectory(lever_records, name):
    nproc, recs = lever_records
    base = _mean_losses(recs, "ddp base" if name.startswith("ddp") else "base")
    assert _mean_losses(recs, name) == pytest.approx(base, rel=2e-5, abs=1e-6)
    rec = next(r for r in recs if r["run"] == name and r["rank"] == 0)
    assert rec["sdpa_backends"] == ["flash/cpu"]
    assert rec["predicted_gb"] > 0


def test_records_say_which_levers_ran(lever_records):
    nproc, recs = lever_records
    by = {r["run"]: r for r in recs if r["rank"] == 0}
    assert by["base"]["optimizer_impl_resolved"] == "for-loop" and by["fused"]["optimizer_impl_resolved"] == "fused"
    assert by["full ckpt"]["checkpointing"] == "full" and by["base"]["checkpointing"] == "none"
    assert by["all"]["micro_batch"] == 4 // nproc // 2 and by["all"]["loss"] == "chunked"
    assert by["all"]["predicted"]["loss_buffers"] == min(48, by["all"]["micro_batch"] * SEQ) * CFG.vocab_size * 12
    assert by["accum last"]["predicted"]["accumulated_unsharded_grads"] > 0
    assert by["accum every"]["predicted"]["accumulated_unsharded_grads"] == 0
    for r in by.values():
        assert "mfu" in r and "hfu" in r  # None on a CPU: no reference peak
    head = F.flops_per_token(CFG, SEQ, include_head=True) - F.flops_per_token(CFG, SEQ)  # counted, not recomputed
    assert math.isclose(by["full ckpt"]["hardware_flops_per_token"] / by["full ckpt"]["flops_per_token"],
                        (F.hardware_flops_per_token(CFG, SEQ, recomputed_layers=CFG.num_layers) + head)
                        / F.flops_per_token(CFG, SEQ, include_head=True))


@pytest.mark.parametrize("argv, says", [
    (["--global-batch", "0"], "argument --global-batch: must be >= 1, got 0"),
    (["--steps", "-2"], "argument --steps: must be >= 1, got -2"),
    (["--ac-every", "zero"], "argument --ac-every: must be an integer, got 'zero'"),
    (["--model", "gpt"], "argument --model: invalid choice: 'gpt'"),
    (["--strategy", "zero2", "--grad-accum", "2"], "DeepSpeed accumulates through its own config"),
    (["--runs", json.dumps([{"name": "x", "grad_accum": 0}])], "--grad-accum must be >= 1, got 0"),
])
def test_a_bad_option_is_one_line_before_any_work(argv, says, capsys, monkeypatch):
    """fsdp_train.py's mistakes end in one line on stderr and exit code 2, before a process group or a model exists
    (the --runs entries included); no usage block, no traceback."""
    script = _load_script()
    monkeypatch.setattr(script, "init_distributed", lambda **_: pytest.fail("work started before the check"))
    with pytest.raises(SystemExit) as exit_:
        script.main(argv)
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1 and says in err, err
    assert err.startswith("fsdp_train.py: error: ") and err.endswith("(see fsdp_train.py --help)")


def _load_script():
    spec = importlib.util.spec_from_file_location("fsdp_train_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_an_accumulated_step_reduces_the_gradients_when_its_mode_says(tmp_path):
    """accum_sync="last" holds the gradients until the last micro-batch (no reduce-scatter before it: the sharded
    parameters have no gradient yet); "every" reduce-scatters after each micro-batch. The losses are the same either
    way, so only what is reduced when can tell them apart (2 processes, 3 micro-batches)."""
    script = Path(__file__).parent / "scripts" / "accum_sync_cases.py"
    recs = launch_forked(script, [], nproc=2, timeout_s=300, env={"OMP_NUM_THREADS": "1"})
    for rec in recs:
        n = rec["params"]
        expected = [0, 0, n] if rec["mode"] == "last" else [n, n, n]
        assert rec["reduced_after_each"] == expected, (rec["rank"], rec["mode"], rec["reduced_after_each"])
    assert sorted(r["mode"] for r in recs) == ["every", "every", "last", "last"]
