"""Distributed cases of tests/test_fsdp.py, all in one launch (process start-up is paid once).

Each case trains the smoke Llama on the same generated tokens and writes one record per rank: the rank's
losses (the test averages them over ranks and compares with a single-process run), full gradients' norms,
dtypes seen during forward, checkpoint round trips. Usage: ``fsdp_cases.py OUT_DIR CASE [CASE ...]``.
"""
import sys

import torch

import dlo  # noqa: F401
from dlo.data import tokens
from dlo.runtime import exit_after_success, init_distributed, teardown, write_record
from dlo.parallel import fsdp

STEPS, GLOBAL_BATCH, SEQ, LR = 3, 4, 32, 3e-3
out_dir, cases = sys.argv[1], sys.argv[2:]
ctx = init_distributed(backend="gloo", device="cpu", timeout_s=300)
cfg = fsdp.SMOKE_LLAMA
dataset, _ = tokens.token_dataset(SEQ, vocab_size=cfg.vocab_size, n_sequences=32)


def data(start=0):
    return fsdp.batches(dataset, GLOBAL_BATCH, ctx.rank, ctx.world_size, start_step=start)


def adamw(model):
    return torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)


def grads_of_first_step(model, loss_scale=1.0):
    ids, labels = next(data())
    fsdp.lm_loss(model(input_ids=ids).logits, labels).mul(loss_scale).backward()
    return {k: v.norm().item() for k, v in fsdp.full_gradients(model).items()}


try:
    for case in cases:
        rec = {"case": case}
        if case == "fsdp":
            model = fsdp.apply_fsdp(fsdp.build_llama(cfg))
            rec.update(fsdp.train_steps(model, adamw(model), data(), STEPS, track_memory=False))
        elif case == "ddp":
            model = fsdp.wrap_ddp(fsdp.build_llama(cfg), ctx, torch.device("cpu"))
            rec.update(fsdp.train_steps(model, adamw(model), data(), STEPS, track_memory=False))
        elif case == "grads":
            rec["grads"] = grads_of_first_step(fsdp.apply_fsdp(fsdp.build_llama(cfg)))
            rec["grads_divided"] = grads_of_first_step(fsdp.apply_fsdp(fsdp.build_llama(cfg)), 1 / ctx.world_size)
        elif case == "bf16":
            model = fsdp.build_llama(cfg)
            seen = []
            fsdp.decoder_layers(model)[0].mlp.down_proj.register_forward_pre_hook(
                lambda m, args: seen.append([str(m.weight.dtype), str(args[0].dtype)]))
            model = fsdp.apply_fsdp(model, mp_policy=fsdp.mixed_precision("bf16"))
            rec.update(fsdp.train_steps(model, adamw(model), data(), 1, track_memory=False))
            rec["forward_dtypes"] = seen[0]
            rec["param_dtypes"] = sorted({str(p.dtype) for p in model.parameters()})
            rec["grad_dtypes"] = sorted({str(p.grad.dtype) for p in model.parameters() if p.grad is not None})
        elif case == "dcp":
            path = f"{out_dir}/dcp"
            model = fsdp.apply_fsdp(fsdp.build_llama(cfg))
            opt = adamw(model)
            straight = fsdp.train_steps(model, opt, data(), 4, track_memory=False)["losses"]
            final = {k: v.full_tensor() for k, v in model.state_dict().items()}
            model = fsdp.apply_fsdp(fsdp.build_llama(cfg))
            opt = adamw(model)
            first = fsdp.train_steps(model, opt, data(), 2, track_memory=False)["losses"]
            fsdp.save_sharded(path, model, opt, step=2)
            model = fsdp.apply_fsdp(fsdp.build_llama(cfg, seed=123))  # other weights: the load must overwrite them
            opt = adamw(model)
            step = fsdp.load_sharded(path, model, opt)
            resumed = fsdp.train_steps(model, opt, data(start=step), 2, track_memory=False)["losses"]
            rec.update(straight=straight, resumed=first + resumed, step=step,
                       params_equal=all(torch.equal(final[k], v.full_tensor()) for k, v in model.state_dict().items()))
        elif case.startswith("zero"):
            stage = int(case[-1])
            model = fsdp.build_llama(cfg)
            engine = fsdp.deepspeed_initialize(model, adamw(model),
                                               fsdp.deepspeed_config(stage, GLOBAL_BATCH, ctx.world_size))
            rec.update(fsdp.train_steps(model, None, data(), STEPS, engine=engine, track_memory=False))
        else:
            raise ValueError(f"unknown case {case!r}")
        write_record(rec)
finally:
    teardown()
exit_after_success()  # every case done and recorded: DeepSpeed's globals must not abort a rank at interpreter exit
