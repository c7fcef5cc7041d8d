"""Worker started by the ``fsdp/ddp``, ``fsdp/fsdp`` and ``fsdp/reshard`` checkers: gloo processes import the
student's script and run its function next to the reference on the models of :data:`fsdp_cases.SHAPES`, each rank
training on its own batches.

Usage (through dlo.course.checks.framework.peer_records): ``fsdp_steps_worker.py SCRIPT STEP``. What each step
compares, on every rank, with the reference:

- ``ddp``: ``wrap_ddp(model, ctx, cpu)`` trained 2 SGD steps against torch's own ``DistributedDataParallel`` of
  the same model: the losses and every weight (DDP averages the gradients over the ranks, so the weights stay the
  same on every rank);
- ``fsdp``: ``apply_fsdp(model)`` (fp32) against :func:`dlo.parallel.fsdp.apply_fsdp`: how many elements of each
  parameter this rank holds (its shard), then the losses and every whole weight after 2 steps;
- ``reshard``: ``apply_fsdp(model, reshard_after_forward=flag)`` for both flags: how many elements of each decoder
  layer's weights this rank still holds after a forward (its shard when resharded, everything when not), then the
  weights after a step (the flag must not change the result).

Each rank writes one record ``{"problems": ["<model>: <difference>", ...], "error": "..."}``.
"""
import sys

import torch

import dlo  # noqa: F401
from dlo.course.checks import fsdp_cases as cases
from dlo.course.exercises import load_exercises
from dlo.parallel import fsdp
from dlo.runtime.distributed import init_distributed, teardown
from dlo.runtime.records import write_record

script, step = sys.argv[1], sys.argv[2]
ctx = init_distributed(backend="gloo", device="cpu", timeout_s=90)
problems: list[str] = []


def compare_training(student, reference, shape, what: str) -> None:
    got, want = cases.train(student, shape, ctx.rank), cases.train(reference, shape, ctx.rank)
    for i, (a, b) in enumerate(zip(got, want)):
        if abs(a - b) > 1e-4 * (1 + abs(b)):
            problems.append(f"{shape.label}: the loss of step {i + 1} is {a:.6g}, expected {b:.6g} (reference: "
                            f"{what})")
            break
    problem = cases.weights_problem(student, reference)
    if problem and not problems:
        problems.append(f"{shape.label}: after 2 steps {problem} (reference: {what})")


def held(model, modules) -> list[int]:
    return [sum(cases.local_numel(p) for p in m.parameters()) for m in modules]


def check_ddp(wrap_ddp) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    for shape in cases.SHAPES[:2]:
        compare_training(wrap_ddp(cases.TinyLM(shape), ctx, torch.device("cpu")), DDP(cases.TinyLM(shape)), shape,
                         "torch's DistributedDataParallel")


def check_fsdp(apply_fsdp) -> None:
    for shape in cases.SHAPES[:2]:
        student, reference = apply_fsdp(cases.TinyLM(shape)), fsdp.apply_fsdp(cases.TinyLM(shape))
        mine, ref = dict(student.named_parameters()), dict(reference.named_parameters())
        for name, p in ref.items():
            got = cases.local_numel(mine[name]) if name in mine else None
            if got != cases.local_numel(p):
                problems.append(f"{shape.label}: this rank holds {got} elements of {name} at rest, the reference "
                                f"{cases.local_numel(p)} (its shard of {p.numel()})")
                break
        compare_training(student, reference, shape, "dlo.parallel.fsdp.apply_fsdp")


def check_reshard(apply_fsdp) -> None:
    for shape in cases.SHAPES[1:]:
        for flag in (True, False):
            student = apply_fsdp(cases.TinyLM(shape), reshard_after_forward=flag)
            reference = fsdp.apply_fsdp(cases.TinyLM(shape), reshard_after_forward=flag)
            losses = [cases.loss_of(m, cases.batch(shape, ctx.rank, 0)) for m in (student, reference)]
            got, want = held(student, student.model.layers), held(reference, reference.model.layers)
            if got != want and not problems:
                i = next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)
                total = sum(p.numel() for p in reference.model.layers[i].parameters())
                problems.append(f"{shape.label}, reshard_after_forward={flag}: after the forward this rank holds "
                                f"{got[i]} elements of decoder layer {i}'s weights, the reference {want[i]} (of "
                                f"{total}: {'its shard' if flag else 'all of them, gathered'})")
            for loss in losses:
                loss.backward()
            problem = cases.weights_problem(student, reference, "the gradient", grads=True)
            if problem and not problems:
                problems.append(f"{shape.label}, reshard_after_forward={flag}: {problem} (reference: "
                                "dlo.parallel.fsdp.apply_fsdp with the same flag)")


error = None
try:
    ns = load_exercises(script)
    {"ddp": lambda: check_ddp(ns["wrap_ddp"]), "fsdp": lambda: check_fsdp(ns["apply_fsdp"]),
     "reshard": lambda: check_reshard(ns["apply_fsdp"])}[step]()
except Exception as exc:  # noqa: BLE001 - reported to the checker
    error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
write_record({"problems": problems, "error": error})
teardown()
