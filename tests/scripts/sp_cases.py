"""Worker for tests/test_sequence_parallel.py: sequence parallelism (dlo.parallel.tensor) against one process.

Run with ``launch(this, args=[case, ...], nproc=tp)``; every rank of the world is one TP group. Cases:

* ``equal``: the single-process :class:`dlo.models.llama.Llama` (reference, same seed) against
  ``TPLlama(sequence_parallel=True)``: largest differences of the logits, the loss, every gradient (gathered,
  after ``reduce_sequence_parallel_grads``) and every weight after one SGD step; the collectives counted
  for one step of plain TP and of SP; the bytes autograd saves inside the norms on this rank, TP and SP;
* ``errors``: the message when tp does not divide the sequence;
* ``dtensor``: ``dtensor_llama(sequence_parallel=True)``'s loss and gradients against the reference and against
  the from-scratch SP model.
"""
import sys

import torch

import dlo  # noqa: F401
from dlo.runtime import init_distributed, teardown, write_record
from dlo.models.llama import Llama, token_batch
from dlo.models.config import TransformerConfig
from dlo.parallel import comm
from dlo.parallel.tensor import (TPLlama, comm_theory, dtensor_full_tensors, dtensor_llama, full_tensors,
                                 norm_saved_bytes_theory, reduce_sequence_parallel_grads, saved_bytes_inside)

# every split divisible by 2 and 3: 12 query heads / 6 K/V heads (GQA groups of 2), vocab 96, 12 tokens
CFG = TransformerConfig(vocab_size=96, hidden_size=48, intermediate_size=96, num_layers=2, num_heads=12,
                        num_kv_heads=6, name="sp test")
BATCH, SEQ, LR = 2, 12, 0.5


def max_diffs(a: dict, b: dict) -> dict:
    assert a.keys() == b.keys(), (sorted(a), sorted(b))
    return {k: float((a[k] - b[k]).abs().max()) for k in a}


def reference():
    ids, labels = token_batch(BATCH, SEQ, CFG.vocab_size, seed=3)
    ref = Llama(CFG, seed=0)
    logits = ref(ids)
    loss = ref.loss(ids, labels)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in ref.named_parameters()}
    torch.optim.SGD(ref.parameters(), lr=LR).step()
    weights = {n: p.detach().clone() for n, p in ref.named_parameters()}
    return ids, labels, logits.detach(), loss.item(), grads, weights


def norms(model):
    return [m for name, m in model.named_modules() if name.endswith("norm")]


def one_step(model, ids, labels):
    """Collectives and saved norm bytes of one forward + backward (vocab-parallel loss)."""
    comm.COUNTER.reset()
    got = saved_bytes_inside(norms(model), lambda: model.loss(ids, labels))
    got["out"].backward()
    counts = comm.COUNTER.rows()
    reduce_sequence_parallel_grads(model)
    extra = [r for r in comm.COUNTER.rows() if r["phase"] == "sp_grads"]
    return got["out"], counts, extra, got["bytes"]


def equal_case(ctx) -> dict:
    tp = ctx.world_size
    ids, labels, ref_logits, ref_loss, ref_grads, ref_weights = reference()
    out = {"case": "equal", "tp": tp}
    tp_model = TPLlama(Llama(CFG, seed=0))
    _, out["tp_counts"], out["tp_sp_grads"], out["tp_norm_bytes"] = one_step(tp_model, ids, labels)
    model = TPLlama(Llama(CFG, seed=0), sequence_parallel=True)
    with torch.no_grad():
        out["logits"] = float((model(ids) - ref_logits).abs().max())
        out["loss_gathered"] = abs(model.loss(ids, labels, vocab_parallel=False).item() - ref_loss)
    loss, out["sp_counts"], out["sp_grads_counts"], out["sp_norm_bytes"] = one_step(model, ids, labels)
    out["loss"] = abs(loss.item() - ref_loss)
    out["grads"] = max_diffs(full_tensors(model, grads=True), ref_grads)
    torch.optim.SGD(model.parameters(), lr=LR).step()
    out["weights"] = max_diffs(full_tensors(model), ref_weights)
    out["theory_tp"] = [{"op": k[0], "phase": k[1], "calls": v} for k, v in comm_theory(CFG.num_layers).items()]
    out["theory_sp"] = [{"op": k[0], "phase": k[1], "calls": v}
                        for k, v in comm_theory(CFG.num_layers, sequence_parallel=True).items()]
    kw = dict(num_layers=CFG.num_layers, batch=BATCH, seq=SEQ, hidden=CFG.hidden_size, tp=tp)
    out["norm_bytes_theory"] = {"tp": norm_saved_bytes_theory(**kw),
                                "sp": norm_saved_bytes_theory(**kw, sequence_parallel=True)}
    out["norm_weight_grads_partial"] = None
    # without the gradient sum, a norm's gradient is this rank's part only: it must differ from the reference
    probe = TPLlama(Llama(CFG, seed=0), sequence_parallel=True)
    probe.loss(ids, labels).backward()
    out["norm_weight_grads_partial"] = float((probe.norm.weight.grad - ref_grads["norm.weight"]).abs().max())
    return out


def errors_case(ctx) -> dict:
    model = TPLlama(Llama(CFG, seed=0), sequence_parallel=True)
    ids, labels = token_batch(BATCH, SEQ + 1, CFG.vocab_size, seed=3)  # 13 tokens: no tp > 1 divides them
    try:
        model.loss(ids, labels)
        message = "no error"
    except ValueError as exc:
        message = str(exc)
    return {"case": "errors", "message": message}


def dtensor_case(ctx) -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    ids, labels, ref_logits, ref_loss, ref_grads, _ = reference()
    mesh = init_device_mesh("cpu", (ctx.world_size,))
    model = dtensor_llama(Llama(CFG, seed=0), mesh, sequence_parallel=True)
    out = {"case": "dtensor", "tp": ctx.world_size}
    with torch.no_grad():
        out["logits"] = float((model(ids) - ref_logits).abs().max())
    loss = model.loss(ids, labels)
    loss.backward()
    scratch = TPLlama(Llama(CFG, seed=0), sequence_parallel=True)
    scratch_loss = scratch.loss(ids, labels)
    out["loss"] = abs(loss.item() - ref_loss)
    out["loss_vs_scratch"] = abs(loss.item() - scratch_loss.item())
    grads = dtensor_full_tensors(model, grads=True)
    out["grads"] = max_diffs({k: v for k, v in grads.items() if k in ref_grads}, ref_grads)
    return out


if __name__ == "__main__":
    torch.set_num_threads(1)
    ctx = init_distributed(backend="gloo", device="cpu", timeout_s=120)
    cases = {"equal": equal_case, "errors": errors_case, "dtensor": dtensor_case}
    try:
        for case in sys.argv[1:]:
            write_record({**cases[case](ctx), "world": ctx.world_size})
    finally:
        teardown()
