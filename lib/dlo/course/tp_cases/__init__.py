"""The cases behind ``dlo check tp <n>`` (tp_tensor_parallel/tp_balises.py) that need real peers, run by the 4
gloo processes of ``checks/tp_worker.py``: one module per group of balises (:mod:`.layers`: 1-8, the parallel
layers and the loss; :mod:`.groups`: 9-11, process groups and TP x DP; :mod:`.sequence`: 12, sequence
parallelism), and here what they share: the collective ``expect`` and the named diagnoses of a wrong sum.
Outside the ``checks`` package so that the worker processes start without importing every course's checkers.
"""
import torch
import torch.distributed as dist

from dlo.models.config import TransformerConfig
from dlo.models.llama import Llama
from dlo.parallel import comm

TP = 2


class Bad(AssertionError):
    pass


def expect(cond, msg):
    """Collective: every rank learns whether ANY rank failed, so that all of them leave the check at the
    same point (a rank leaving early would pair its next collective with its peer's current one)."""
    flag = torch.tensor([0.0 if cond else 1.0])
    dist.all_reduce(flag)
    if flag.item() > 0:
        raise Bad(msg if not cond else f"{msg} (seen on another rank)")


def tolerance(dtype):
    """What two ways of summing the same numbers may differ by, in ``dtype`` (relative to the numbers' size)."""
    return 1e-9 if dtype == torch.float64 else 1e-5


def close(a, b, tol=None):
    """Same shape and the same numbers, up to ``tol`` (by default the tolerance of ``b``'s dtype, scaled by its size;
    a result in another dtype than ``b`` is compared at the looser of the two)."""
    if a is None or b is None or a.shape != b.shape:
        return False
    if tol is None:
        tol = max(tolerance(a.dtype), tolerance(b.dtype)) * max(1.0, float(b.detach().abs().max()) if b.numel() else 1)
    return bool((a.detach().double() - b.detach().double()).abs().max() <= tol) if a.numel() else True


def fail_together():
    """The collective half of a failed ``expect``, for a rank that raised something else (a shape error...):
    its peers, at their next ``expect``, learn that a rank failed instead of pairing with another collective."""
    dist.all_reduce(torch.tensor([1.0]))


def sum_hint(y, want, tp=TP):
    """What a wrong sum of the ranks' partial results looks like, named (tp = 2 groups inside 4 ranks whose
    two TP groups compute the same numbers: a sum over every rank is twice the TP sum)."""
    if y is None or y.shape != want.shape or float(want.abs().max()) < 1e-6:
        return ""
    if tp == 2 and close(y, 2 * want):
        return (" -- it is exactly twice the expected sum: the all-reduce ran over every rank instead of the "
                "TP group (pass the group), or ran twice")
    if tp > 1 and close(y, want / tp):
        return " -- it is the expected sum / tp: the partial results must be summed, not averaged"
    return ""


def precision_hint(y, want):
    """A float64 result right only to float32's precision, named (something computed in float32 on the way)."""
    if want.dtype != torch.float64 or y is None or close(y, want) or not close(y, want, 1e-4):
        return ""
    return (" -- it matches only to float32's precision: keep the dtype of the layer and its input all the way (a "
            "buffer made without dtype= is float32)")


def counted():
    """The collectives counted since the last reset, in words."""
    rows = comm.COUNTER.summary()
    return ", ".join(f"{v['calls']} {op} ({phase})" for (op, phase), v in rows.items()) or "none"


def seeded(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))



#: The Llama of balises 7, 8 and 11 at tp = 2: vocabulary, hidden and intermediate sizes all different.
CFG = TransformerConfig(vocab_size=80, hidden_size=24, intermediate_size=56, num_layers=2, num_heads=4, num_kv_heads=2)


def _grads_vs_reference(ns, group, model, loss, ids, labels, rows=slice(None), cfg=CFG, where=""):
    ref = Llama(cfg, seed=0)
    ref_loss = ref.loss(ids, labels)
    expect(abs(float(loss) - float(ref_loss)) < 1e-5 or rows != slice(None),
           f"{where}loss {float(loss):.6f} differs from the single-process model's {float(ref_loss):.6f}")
    ref_loss.backward()
    grads = ns["full_tensors"](model, group, grads=True)
    for name, p in ref.named_parameters():
        expect(name in grads, f"{where}parameter {name} missing from the TP model (keep Llama's names)")
        expect(close(grads[name], p.grad), f"{where}gradient of {name} differs from the single-process model's")
    return ref
