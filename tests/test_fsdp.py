"""FSDP2 / DeepSpeed ZeRO helpers (dlo.parallel.fsdp): equal to single-process training, pitfalls, clear errors.

The distributed cases run in ONE 2-process gloo launch (tests/scripts/fsdp_cases.py); the single-process
references run here, on the same model (same seed), the same generated tokens and the same optimizer.
"""
from __future__ import annotations

import importlib.util
import statistics
from pathlib import Path

import pytest
import torch

import dlo  # noqa: F401
from dlo.data import tokens
from dlo.runtime.launch import launch_forked
from dlo.models.config import LLAMA_3_2_3B
from dlo.measure.memory import count_parameters
from dlo.parallel import fsdp

CASES = Path(__file__).parent / "scripts" / "fsdp_cases.py"
STEPS, GLOBAL_BATCH, SEQ, LR = 3, 4, 32, 3e-3  # as in fsdp_cases.py
# DeepSpeed is optional (GPU nodes often lack it; `make test-compat` runs without it): its cases then skip.
HAVE_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None
ZERO_CASES = ["zero1", "zero2", "zero3"]


def _single_process(loss_scale: float = 1.0):
    cfg = fsdp.SMOKE_LLAMA
    dataset, _ = tokens.token_dataset(SEQ, vocab_size=cfg.vocab_size, n_sequences=32)
    model = fsdp.build_llama(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    ids, labels = next(fsdp.batches(dataset, GLOBAL_BATCH, 0, 1))
    fsdp.lm_loss(model(input_ids=ids).logits, labels).backward()
    grads = {k: v.norm().item() for k, v in fsdp.full_gradients(model).items()}
    model = fsdp.build_llama(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    run = fsdp.train_steps(model, opt, fsdp.batches(dataset, GLOBAL_BATCH, 0, 1), STEPS, track_memory=False)
    return run["losses"], grads


@pytest.fixture(scope="module")
def reference():
    return _single_process()


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp_cases")
    # An empty extension cache: the run fails (timeout) if DeepSpeed tried to JIT-compile anything.
    env = {"OMP_NUM_THREADS": "1", "TORCH_EXTENSIONS_DIR": str(out / "ext")}
    cases = ["fsdp", "ddp", "grads", "bf16", "dcp", *(ZERO_CASES if HAVE_DEEPSPEED else [])]
    recs = launch_forked(CASES, [str(out), *cases], nproc=2,
                  timeout_s=300, env=env)
    assert not (out / "ext").exists() or not any((out / "ext").iterdir()), "DeepSpeed compiled an extension"
    return {(r["case"], r["rank"]): r for r in recs}


def _mean_losses(records, case):
    per_rank = [records[(case, r)]["losses"] for r in (0, 1)]
    return [statistics.mean(step) for step in zip(*per_rank)]


@pytest.mark.parametrize("case", ["fsdp", "ddp", *(pytest.param(z, marks=pytest.mark.skipif(
    not HAVE_DEEPSPEED, reason="deepspeed is not installed")) for z in ZERO_CASES)])
def test_two_processes_follow_the_single_process_trajectory(records, reference, case):
    losses, _ = reference
    assert _mean_losses(records, case) == pytest.approx(losses, rel=1e-4, abs=1e-5)


def test_gradients_are_averaged_once_not_divided_again(records, reference):
    _, grads = reference
    rec = records[("grads", 0)]
    for name, norm in grads.items():
        assert rec["grads"][name] == pytest.approx(norm, rel=1e-4, abs=1e-7), name
        # the pitfall: dividing the loss by the world size on top of FSDP's averaging halves every gradient
        assert rec["grads_divided"][name] == pytest.approx(norm / 2, rel=1e-4, abs=1e-7), name


def test_mixed_precision_bf16_compute_fp32_params_and_reduction(records):
    rec = records[("bf16", 0)]
    assert rec["forward_dtypes"] == ["torch.bfloat16", "torch.bfloat16"]  # gathered weights and activations
    assert rec["param_dtypes"] == ["torch.float32"]  # the sharded parameters the optimizer updates
    assert rec["grad_dtypes"] == ["torch.float32"]  # reduce_dtype fp32


def test_dcp_resume_is_bit_exact(records):
    for rank in (0, 1):
        rec = records[("dcp", rank)]
        assert rec["step"] == 2
        assert rec["resumed"] == rec["straight"]  # exact equality, not approx
        assert rec["params_equal"]


def test_exact_llama_3_2_3b_on_the_meta_device():
    assert count_parameters(fsdp.model_config("llama-3.2-3b"))["total"] == 3_212_749_824
    model = fsdp.build_llama(LLAMA_3_2_3B, device="meta")
    assert sum(p.numel() for p in model.parameters()) == 3_212_749_824
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied embeddings
    assert len(fsdp.decoder_layers(model)) == 28


def test_presets_and_configs():
    assert fsdp.mixed_precision("fp32") is None
    mp = fsdp.mixed_precision("bf16")
    assert mp.param_dtype == torch.bfloat16 and mp.reduce_dtype == torch.float32
    cfg = fsdp.deepspeed_config(3, 8, 2)
    assert cfg["zero_optimization"]["stage"] == 3 and cfg["train_micro_batch_size_per_gpu"] == 4
    assert cfg["train_batch_size"] == 8 and not cfg["bf16"]["enabled"]


def test_activation_checkpointing_and_compile_wrap_every_layer():
    model = fsdp.apply_activation_checkpointing(fsdp.build_llama(fsdp.SMOKE_LLAMA))
    assert all(type(layer).__name__ == "CheckpointWrapper" for layer in fsdp.decoder_layers(model))
    ids = torch.randint(0, 256, (2, 16))
    ref = fsdp.build_llama(fsdp.SMOKE_LLAMA)
    torch.testing.assert_close(model(input_ids=ids).logits, ref(input_ids=ids).logits)
    compiled = fsdp.compile_layers(fsdp.build_llama(fsdp.SMOKE_LLAMA))
    assert all(layer._compiled_call_impl is not None for layer in fsdp.decoder_layers(compiled))


def test_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="not divisible by world size 3"):
        tokens.per_rank_batch(8, 3)
    with pytest.raises(ValueError, match="not divisible"):
        fsdp.deepspeed_config(1, 5, 2)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        fsdp.build_llama(fsdp.SMOKE_LLAMA, model_path=tmp_path / "nope")
    with pytest.raises(ValueError, match="CPU offload .* trains on cpu"):
        fsdp.offload_policy("cpu", True)
    assert type(fsdp.offload_policy("cpu", False)).__name__ == "OffloadPolicy"
    assert type(fsdp.offload_policy("cuda", True)).__name__ == "CPUOffloadPolicy"
    with pytest.raises(ValueError, match="unknown precision"):
        fsdp.mixed_precision("fp8")
    with pytest.raises(ValueError, match="unknown model"):
        fsdp.model_config("gpt5")


def test_from_pretrained_local_folder(tmp_path):
    model = fsdp.build_llama(fsdp.SMOKE_LLAMA, seed=3)
    model.save_pretrained(tmp_path / "m")
    loaded = fsdp.build_llama(fsdp.SMOKE_LLAMA, model_path=tmp_path / "m")
    for (k, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), k


def test_throughput_and_mfu_on_cpu_is_none():
    out = fsdp.throughput(fsdp.SMOKE_LLAMA, 32, 4, 0.1, "cpu", precision="fp32")
    assert out["tokens_per_s"] == pytest.approx(1280) and out["mfu"] is None


@pytest.mark.parametrize("precision, peak_tflops", [("fp32", 67.0), ("bf16", 989.0), ("bf16-reduce-bf16", 989.0)])
def test_mfu_divides_by_the_peak_of_the_precision_the_step_computes_in(precision, peak_tflops):
    # an fp32 run on an H100 is measured against 67 TFLOP/s, not bf16's 989 (an MFU 15x too low)
    name, n_gpus = "NVIDIA H100 80GB HBM3", 2
    out = fsdp.throughput(fsdp.SMOKE_LLAMA, 32, 4, 0.1, "cpu", n_gpus, precision=precision, gpu_name=name)
    assert out["peak_precision"] == ("fp32" if precision == "fp32" else "bf16")
    assert out["peak_flops"] == n_gpus * peak_tflops * 1e12
    assert out["mfu"] == pytest.approx(out["tokens_per_s"] * out["flops_per_token"] / (n_gpus * peak_tflops * 1e12))


def test_compute_precision_of_an_fp32_run_is_tf32_only_when_switched_on():
    before = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        assert fsdp.compute_precision("fp32", "cpu") == "fp32"
        assert fsdp.compute_precision("fp32", "cuda") == "fp32"  # TF32 off (the default) for matmuls
        torch.backends.cuda.matmul.allow_tf32 = True
        assert fsdp.compute_precision("fp32", "cuda") == "tf32"
        assert fsdp.compute_precision("fp32", "cpu") == "fp32"
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    with pytest.raises(ValueError, match="unknown precision"):
        fsdp.compute_precision("fp8", "cpu")
