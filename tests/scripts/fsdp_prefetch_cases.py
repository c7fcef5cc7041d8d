"""Distributed cases of tests/test_fsdp_prefetch.py, in one launch: the prefetch modes of
``dlo.parallel.fsdp.set_prefetch`` on the smoke Llama (2 steps each, fp32, gloo).

Per mode and rank one record: the losses, the largest gradient difference from the default mode after the
first backward, the collectives of one step (count and bytes), and how many all-gathers had been issued
when each decoder layer's compute began, in forward and in backward (what prefetching changes). Then the
public and the internal answer of ``is_resharded_after_forward``. Last, the workshop script's own runs
(``tp_fsdp/fsdp_train.py``: compute-only baseline, then FSDP with two prefetch modes, timed until steady), in
these processes: their records carry ``run`` instead of ``case``. Usage: ``fsdp_prefetch_cases.py``.
"""
import importlib.util
import json
from pathlib import Path

import torch

import dlo  # noqa: F401
from dlo.data import tokens
from dlo.parallel import fsdp
from dlo.runtime import exit_after_success, expand_runs, init_distributed, teardown, write_record

STEPS, GLOBAL_BATCH, SEQ, LR = 2, 4, 32, 3e-3
ctx = init_distributed(backend="gloo", device="cpu", timeout_s=300)
cfg = fsdp.SMOKE_LLAMA
dataset, _ = tokens.token_dataset(SEQ, vocab_size=cfg.vocab_size, n_sequences=32)


def instrumented(model, counter, marks):
    """Hooks that note the number of all-gathers issued so far when each layer's compute starts."""
    def gathers():
        return sum(1 for name, _ in counter.calls if name == "all_gather")

    for i, layer in enumerate(fsdp.decoder_layers(model)):
        layer.input_layernorm.register_forward_pre_hook(lambda m, a, i=i: marks["forward"].append([i, gathers()]))
        layer.mlp.register_full_backward_pre_hook(lambda m, g, i=i: marks["backward"].append([i, gathers()]))


try:
    reference = None
    for mode in fsdp.PREFETCH_MODES:
        model = fsdp.apply_fsdp(fsdp.build_llama(cfg))
        fsdp.set_prefetch(model, mode, depth=1)
        opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
        data = fsdp.batches(dataset, GLOBAL_BATCH, ctx.rank, ctx.world_size)
        marks = {"forward": [], "backward": []}
        losses = []
        with fsdp.CollectiveCounter() as counter:
            instrumented(model, counter, marks)
            ids, labels = next(data)
            loss = fsdp.lm_loss(model(input_ids=ids).logits, labels)
            loss.backward()
            per_step = counter.summary()
        grads = fsdp.full_gradients(model)
        reference = reference or grads
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        for _ in range(STEPS - 1):
            ids, labels = next(data)
            losses.append(fsdp.train_step(model, opt, ids, labels).item())
        write_record({"case": "prefetch", "mode": mode, "losses": losses, "collectives": per_step,
                      "max_grad_diff": max((grads[k] - reference[k]).abs().max().item() for k in reference),
                      "same_grad_names": sorted(grads) == sorted(reference), "marks": marks})

    # the compute-only baseline: the plain model, no collective at all in its step
    model = fsdp.build_llama(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    ids, labels = next(fsdp.batches(dataset, GLOBAL_BATCH, ctx.rank, ctx.world_size))
    with fsdp.CollectiveCounter() as counter:
        fsdp.train_step(model, opt, ids, labels)
    write_record({"case": "compute-only", "collectives": counter.summary()})

    ids = next(fsdp.batches(dataset, GLOBAL_BATCH, ctx.rank, ctx.world_size))[0]
    answers = {}
    for reshard in (True, False):
        model = fsdp.apply_fsdp(fsdp.build_llama(cfg), reshard_after_forward=reshard)
        layer = fsdp.decoder_layers(model)[0]
        internal = fsdp.is_resharded_after_forward(layer)
        public = fsdp.is_resharded_after_forward(layer, forward=lambda m=model: m(input_ids=ids))
        answers[str(reshard)] = {"internal": internal, "public": public}
    write_record({"case": "reshard", "answers": answers})

    path = Path(__file__).resolve().parents[2] / "tp_fsdp" / "fsdp_train.py"
    spec = importlib.util.spec_from_file_location("fsdp_train_under_test", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    runs = [{"name": "compute only", "compute_only": True}, {"name": "default"}, {"name": "none", "prefetch": "none"}]
    args = script.parse_args(["--model", "smoke", "--seq-len", str(SEQ), "--global-batch", str(GLOBAL_BATCH),
                              "--steps", str(STEPS), "--warmup-steps", "1", "--timed-repeats", "3",
                              "--warmup-max-calls", "3", "--runs", json.dumps(runs)])
    script_data, _ = tokens.token_dataset(SEQ, vocab_size=cfg.vocab_size, n_sequences=64)
    for name, run_args in expand_runs(args, args.runs):
        script.run(run_args, ctx, torch.device("cpu"), script_data, name)
except BaseException:
    teardown()
    raise
exit_after_success()
