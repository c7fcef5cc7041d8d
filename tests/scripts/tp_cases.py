"""Worker for tests/test_tp.py: from-scratch tensor parallelism (dlo.parallel.tensor) against one process.

Run with ``launch(this, args=[layout, ...], nproc=N)`` where each layout is ``"<tp>x<dp>"`` with
``tp * dp == N``. For each layout every rank builds the single-process :class:`dlo.models.llama.Llama` (the
reference, same seed), slices it into a :class:`TPLlama` over its TP group, runs one forward/backward
on its DP share of a fixed global batch (gradients averaged over the DP group), one SGD step, and rank 0
writes the largest differences with the reference (logits, loss, every gradient, every weight after the
step) plus the collective counts. ``dtensor`` adds the same check for ``dtensor_llama`` (tp = N),
``dtensor_tied`` the same with tied embeddings (the LM head must stay the embedding's weight), and
``errors`` records the messages of the divisibility errors.
"""
import sys

import torch

import dlo  # noqa: F401
from dlo.runtime import init_distributed, teardown, write_record
from dlo.models.llama import Llama, token_batch
from dlo.models.config import TransformerConfig
from dlo.parallel import comm
from dlo.parallel.tensor import (TPLlama, all_reduce_gradients, comm_theory, dtensor_full_tensors, dtensor_llama, full_tensors, tp_dp_groups)

CFG = TransformerConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=8,
                        num_kv_heads=4, name="tp test")
BATCH, SEQ, LR = 4, 16, 0.5


def max_diffs(a: dict, b: dict) -> dict:
    assert a.keys() == b.keys(), (sorted(a), sorted(b))
    return {k: float((a[k] - b[k]).abs().max()) for k in a}


def reference(cfg=CFG):
    ids, labels = token_batch(BATCH, SEQ, cfg.vocab_size, seed=1)
    ref = Llama(cfg, seed=0)
    logits = ref(ids)
    loss = ref.loss(ids, labels)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in ref.named_parameters()}
    torch.optim.SGD(ref.parameters(), lr=LR).step()
    weights = {n: p.detach().clone() for n, p in ref.named_parameters()}
    return ids, labels, logits.detach(), loss.item(), grads, weights


def layout_case(layout: str, ctx) -> dict:
    tp, dp = (int(v) for v in layout.split("x"))
    g = tp_dp_groups(tp, dp)
    ids, labels, ref_logits, ref_loss, ref_grads, ref_weights = reference()
    per = BATCH // dp
    rows = slice(g["dp_rank"] * per, (g["dp_rank"] + 1) * per)
    model = TPLlama(Llama(CFG, seed=0), g["tp_group"])
    out = {"case": layout, "tp": tp, "dp": dp, "tp_rank": g["tp_rank"], "dp_rank": g["dp_rank"]}
    with torch.no_grad():
        out["logits"] = float((model(ids[rows]) - ref_logits[rows]).abs().max())
        out["loss_gathered"] = model.loss(ids[rows], labels[rows], vocab_parallel=False).item()
    comm.COUNTER.reset()
    loss = model.loss(ids[rows], labels[rows])
    loss.backward()
    out["counts"] = comm.COUNTER.rows()
    out["theory"] = [{"op": k[0], "phase": k[1], "calls": v} for k, v in comm_theory(CFG.num_layers).items()]
    all_reduce_gradients(model, g["dp_group"])
    loss_dp = comm.all_reduce(loss.detach(), g["dp_group"], phase="metrics") / dp
    out["loss"] = abs(float(loss_dp) - ref_loss)
    out["loss_gathered"] = abs(float(comm.all_reduce(torch.tensor(out["loss_gathered"]), g["dp_group"]) / dp) - ref_loss)
    out["grads"] = max_diffs(full_tensors(model, g["tp_group"], grads=True), ref_grads)
    out["local_vocab"] = model.lm_head.weight.shape[0]
    torch.optim.SGD(model.parameters(), lr=LR).step()
    out["weights"] = max_diffs(full_tensors(model, g["tp_group"]), ref_weights)
    return out


def dtensor_case(ctx, tied: bool = False) -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    cfg = CFG.replace(tie_embeddings=True) if tied else CFG
    mesh = init_device_mesh("cpu", (ctx.world_size,))
    ids, labels, ref_logits, ref_loss, ref_grads, ref_weights = reference(cfg)
    model = dtensor_llama(Llama(cfg, seed=0), mesh)
    out = {"case": "dtensor_tied" if tied else "dtensor", "tp": ctx.world_size,
           "tied": model.lm_head.weight is model.embed_tokens.weight}
    with torch.no_grad():
        out["logits"] = float((model(ids) - ref_logits).abs().max())
    loss = model.loss(ids, labels)
    loss.backward()
    out["loss"] = abs(loss.item() - ref_loss)
    grads = dtensor_full_tensors(model, grads=True)
    out["extra_params"] = sorted(set(grads) - set(ref_grads))  # an untied head shows up here
    out["grads"] = max_diffs({k: v for k, v in grads.items() if k in ref_grads}, ref_grads)
    return out


def errors_case(ctx) -> dict:
    messages = {}
    bad = {"heads": dict(num_heads=3, num_kv_heads=3, hidden_size=48), "kv_heads": dict(num_kv_heads=1),
           "vocab": dict(vocab_size=255), "intermediate": dict(intermediate_size=129)}
    for name, change in bad.items():
        try:
            TPLlama(Llama(CFG.replace(**change), seed=0))
            messages[name] = "no error"
        except ValueError as exc:
            messages[name] = str(exc)
    try:
        tp_dp_groups(ctx.world_size, 2)
        messages["tp_dp"] = "no error"
    except ValueError as exc:
        messages["tp_dp"] = str(exc)
    return {"case": "errors", "messages": messages}


if __name__ == "__main__":
    torch.set_num_threads(1)
    ctx = init_distributed(backend="gloo", device="cpu", timeout_s=120)
    try:
        for case in sys.argv[1:]:
            if case in ("dtensor", "dtensor_tied"):
                rec = dtensor_case(ctx, tied=case == "dtensor_tied")
            elif case == "errors":
                rec = errors_case(ctx)
            else:
                rec = layout_case(case, ctx)
            write_record(rec)
    finally:
        teardown()
