"""Checkers of the JIT and compilation notebook (Jour3/jit.ipynb), course ``jit``.

Both stay fast on a CPU: ``graph_break`` uses ``torch._dynamo.explain`` (graph capture only, no code
generation) and ``compiled_step`` passes a recording backend to the student's ``torch.compile`` call, so
Dynamo captures the graphs and nothing is compiled to machine code.
"""
from __future__ import annotations

import contextlib
import random
from typing import Any, Callable, Iterator

import torch
from torch import nn

from dlo.course.checks.cases import Case, compare, first_failure, run_student, seeded
from dlo.course.checks.framework import CheckFailed, expect, register
from dlo.lessons.jit import captured_warnings

JIT_NB = "Jour3/jit.ipynb"


def _clip_reference(x: torch.Tensor, max_norm: float) -> torch.Tensor:
    norm = torch.linalg.vector_norm(x)
    if norm.item() > max_norm:
        return x * (max_norm / norm)
    return x


def _close(a: Any, b: torch.Tensor, what: str) -> None:
    expect(isinstance(a, torch.Tensor), f"{what}: return a tensor, got {type(a).__name__}")
    expect(a.shape == b.shape, f"{what}: expected shape {tuple(b.shape)}, got {tuple(a.shape)}")
    try:
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    except AssertionError:
        raise CheckFailed(f"{what}: wrong values (largest difference {(a - b).abs().max().item():.3g})") from None


@register("jit", "graph_break", ("clip_by_norm",), JIT_NB)
def _check_graph_break(clip_by_norm: Callable) -> str:
    g = torch.Generator().manual_seed(0)
    cases = [
        ("a vector with norm > max_norm (it must be scaled down)", torch.randn(50, generator=g) * 3, 1.0),
        ("a vector with norm < max_norm (it must come back unchanged)", torch.randn(50, generator=g) * 0.01, 1.0),
        ("a matrix, max_norm=5", torch.randn(6, 7, generator=g) * 2, 5.0),
        ("a zero vector", torch.zeros(10), 1.0),
    ]
    for what, x, max_norm in cases:
        x_before = x.clone()
        out = clip_by_norm(x, max_norm)
        expect(torch.equal(x, x_before), "do not modify x in place: return a new tensor")
        if x.dim() > 1 and isinstance(out, torch.Tensor) and out.shape == x.shape:
            per_row = x_before * torch.clamp(max_norm / torch.linalg.vector_norm(x_before, dim=-1, keepdim=True), max=1.0)
            expect(not torch.allclose(out, per_row, rtol=1e-5, atol=1e-6),
                   f"on {what}: each row is clipped by its own norm: clip by the norm of the whole tensor "
                   "(torch.linalg.vector_norm(x), no dim)")
        if isinstance(out, torch.Tensor) and out.shape == x.shape and x.abs().sum() > 0:
            squared = x_before * torch.clamp(max_norm / x_before.pow(2).sum(), max=1.0)
            expect(not torch.allclose(out, squared, rtol=1e-5, atol=1e-6) or torch.allclose(out, x_before),
                   f"on {what}: wrong values -- that divides by the squared norm (sum of squares): the norm is its "
                   "square root")
        _close(out, _clip_reference(x_before, max_norm), f"on {what}")
    _compare_generated(clip_by_norm)
    for what, x, max_norm in cases[:2]:
        with captured_warnings():  # Dynamo logs a warning per graph break: the message below says it
            explained = torch._dynamo.explain(clip_by_norm)(x.clone(), max_norm)
        reasons = [str(r.reason).strip().splitlines()[0] for r in explained.break_reasons]
        expect(explained.graph_break_count == 0 and not reasons,
                f"on {what}, torch._dynamo.explain still finds {max(explained.graph_break_count, len(reasons))} "
                f"graph break(s): {'; '.join(reasons) or 'see explain()'} -- no .item(), print or Python `if` on tensor values")
        expect(explained.graph_count == 1, f"expected the whole function in one graph, explain found {explained.graph_count}")
    return "same values and gradients as the reference on both sides of max_norm (12 seeded shapes and dtypes), and explain() finds one graph, 0 breaks"


def _clip_case(rng: random.Random) -> Case:
    shape = rng.choice([(), (1,), (7,), (3, 5), (2, 3, 4)])
    dtype = rng.choice([torch.float32, torch.float64, torch.bfloat16])
    max_norm, factor = rng.choice([0.5, 1.0, 5.0]), rng.choice([0.3, 0.9, 1.1, 4.0])
    g = torch.Generator().manual_seed(rng.randint(0, 10 ** 6))
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    x = (x * factor * max_norm / torch.linalg.vector_norm(x)).to(dtype)  # the norm a factor above or below max_norm
    label = f"{str(dtype).replace('torch.', '')}, shape {tuple(shape)}, norm {factor} x max_norm={max_norm}"
    return Case(label, {"x": x, "max_norm": max_norm}, size=x.numel())


def _clip_clamped(x: torch.Tensor, max_norm: float) -> torch.Tensor:
    return x * torch.clamp(max_norm / torch.linalg.vector_norm(x), max=1.0)


def _compare_generated(clip_by_norm: Callable) -> None:
    """Values and gradients against the reference on seeded shapes (scalar to 3-d), dtypes (float32, float64,
    bfloat16) and norms on both sides of max_norm. The tolerance is float32's (or bfloat16's): an epsilon added to
    the norm, as torch.nn.utils.clip_grad_norm_ does, is a right answer."""
    cases = seeded(_clip_case, 12, seed=2)
    failure = first_failure(cases, lambda x, max_norm: clip_by_norm(x, max_norm), _clip_clamped, what="the result",
                            grads=True, dtype_of=lambda c: c.kwargs["x"].dtype if c.kwargs["x"].dtype == torch.bfloat16
                            else torch.float32, scale=10)
    if failure:
        case, problem = failure
        raise CheckFailed(f"with {case.label}: {problem}")


def _tiny_run(dtype: torch.dtype = torch.float32) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3)).to(dtype)
    # plain SGD, one tensor at a time: the quickest optimizer step for Dynamo to trace (the check stays a few s)
    return model, torch.optim.SGD(model.parameters(), lr=0.1, foreach=False)


#: The losses the step is tried with: the lesson's cross-entropy, a label-smoothed one and a regression loss on
#: float targets (a step that ignores loss_fn gives other values on the last two).
_LOSSES: dict[str, Callable] = {"cross_entropy": nn.functional.cross_entropy,
                                "label-smoothed cross_entropy": nn.CrossEntropyLoss(label_smoothing=0.2),
                                "mse_loss on float targets": nn.functional.mse_loss}


def _step_case(loss: str, dtype: torch.dtype, sizes: tuple[int, ...], seed: int) -> Case:
    label = f"{loss}, {str(dtype).replace('torch.', '')}, batches of {', '.join(map(str, sizes))} (one per step)"
    return Case(label, dict(loss=loss, dtype=dtype, sizes=sizes, seed=seed), size=len(sizes))


#: Each case is one torch.compile (Dynamo traces the step once, and once more when the batch size changes): three
#: cases keep the check at a few seconds. A new batch at every step; sizes that change between steps.
STEP_CASES = [_step_case("cross_entropy", torch.float32, (8, 8, 5), 1),
              _step_case("label-smoothed cross_entropy", torch.float64, (3, 3), 2),
              _step_case("mse_loss on float targets", torch.float32, (4, 4), 3)]


def _step_batches(loss: str, dtype: torch.dtype, sizes: tuple[int, ...], seed: int) -> list[tuple]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in sizes:
        x = torch.randn(n, 6, generator=g, dtype=torch.float64).to(dtype)
        y = (torch.randn(n, 3, generator=g, dtype=torch.float64).to(dtype) if loss.startswith("mse")
             else torch.randint(0, 3, (n,), generator=g))
        out.append((x, y))
    return out


def _eager(case: Case, variant: str = "right") -> tuple[list[float], list[torch.Tensor]]:
    """The eager training (losses and final weights) of ``case``; ``variant`` is a known mistake's."""
    model, opt = _tiny_run(case.kwargs["dtype"])
    loss_fn = nn.functional.cross_entropy if variant == "cross_entropy" else _LOSSES[case.kwargs["loss"]]
    losses = []
    for x, y in _step_batches(**case.kwargs):
        loss = loss_fn(model(x), y)
        if variant != "no_zero_grad":
            opt.zero_grad(set_to_none=variant != "zero_after_backward")
        if variant == "zero_after_backward":
            loss.backward()
            opt.zero_grad(set_to_none=False)
        else:
            loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().clone() for p in model.parameters()]


_STEP_MISTAKES = {
    "no_zero_grad": "the gradients are never cleared, so every earlier step's are added in: zero the gradients at "
                    "every step",
    "zero_after_backward": "the update used gradients cleared after backward (the weights never move): forward, "
                           "loss, zero_grad, backward, optimizer.step, in that order",
    "cross_entropy": "the loss is cross-entropy whatever loss_fn is: compute the loss with the loss_fn given",
}


def _op_names(gm: torch.fx.GraphModule) -> list[str]:
    return [getattr(n.target, "__name__", str(n.target)) for n in gm.graph.nodes
            if n.op in ("call_function", "call_method", "call_module")]


_MADE: dict = {}  # marks, in the list of recorded calls, the moment the step was made


@contextlib.contextmanager
def _watched_compile(backend: Callable) -> Iterator[list[dict]]:
    """Record every ``torch.compile`` call made inside; a call without the checker's backend fails at once (it
    would compile to machine code with the default backend, which takes tens of seconds and checks nothing)."""
    real = torch.compile
    calls: list[dict] = []

    def watched(*args: Any, **kwargs: Any) -> Any:
        if calls and calls[-1] is _MADE:
            raise CheckFailed("torch.compile was called again while the step ran: compile once, when the step is "
                              "made, and return the compiled function (a new compiled function per call recompiles "
                              "every step)")
        calls.append(kwargs)
        if kwargs.get("backend") is not backend:
            raise CheckFailed("torch.compile was called without the options the caller gave: pass "
                                  "compile_kwargs on to it (the checker gives its own backend there)")
        return real(*args, **kwargs)

    torch.compile = watched
    try:
        yield calls
    finally:
        torch.compile = real


def _compiled_run(make_compiled_step: Callable, case: Case) -> tuple[list, nn.Module, list]:
    """The answer's compiled step on ``case`` (a fresh Dynamo cache and the checker's recording backend): the
    returned losses, the model after the steps and the captured graphs."""
    graphs: list[torch.fx.GraphModule] = []

    def recording_backend(gm: torch.fx.GraphModule, example_inputs: Any) -> Callable:
        graphs.append(gm)
        return gm.forward  # run the captured graph as is: checks the capture, costs no compilation

    model, opt = _tiny_run(case.kwargs["dtype"])
    # code Dynamo compiled earlier in this process (another answer, the notebook) would be reused from its cache
    # without going through this backend: start from an empty cache so that every graph is seen
    torch._dynamo.reset()

    def run(**_: Any) -> list:
        with _watched_compile(recording_backend) as calls:
            step = make_compiled_step(model, opt, _LOSSES[case.kwargs["loss"]], backend=recording_backend)
            calls.append(_MADE)  # from here on, a call to torch.compile is a compile per step: refused at once
            expect(callable(step), "return the compiled step, a function of (images, labels)")
            with captured_warnings():  # Dynamo's notes while tracing the optimizer (e.g. record_function ignored)
                return [step(x, y) for x, y in _step_batches(**case.kwargs)]

    return run_student(run, case), model, graphs


def _check_capture(graphs: list) -> None:
    expect(bool(graphs), "nothing went through torch.compile: the step you return must be the compiled "
                         "function (and pass compile_kwargs on: the checker gives its own backend)")
    ops = [name for gm in graphs for name in _op_names(gm)]
    expect(any("linear" in o for o in ops), "the model's forward pass must run inside the compiled function")
    expect(any("cross_entropy" in o or "nll_loss" in o for o in ops),
           "compile the whole step, not just the model: the loss must be computed inside the compiled function")
    expect(any(o.endswith("add_") or "foreach" in o for o in ops),
           "call optimizer.step() inside the compiled function (no parameter update was captured)")


@register("jit", "compiled_step", ("make_compiled_step",), JIT_NB)
def _check_compiled_step(make_compiled_step: Callable) -> str:
    runs, n_graphs = [], 0
    for case in STEP_CASES:
        losses, model, graphs = _compiled_run(make_compiled_step, case)
        if case is STEP_CASES[0]:
            _check_capture(graphs)
            n_graphs = len(graphs)
        for i, got in enumerate(losses, 1):
            expect(isinstance(got, torch.Tensor) and got.ndim == 0,
                   f"with {case.label}: step {i}: return the loss as a 0-d tensor (no .item())")
            expect(not got.requires_grad, f"with {case.label}: step {i}: the returned loss still requires grad: "
                                          "detach it (the caller must not keep the autograd graph)")
        runs.append(([float(t) for t in losses], [p.detach().clone() for p in model.parameters()]))
    for case, (losses, weights) in zip(STEP_CASES, runs):
        problem = _step_difference((losses, weights), _eager(case), case)
        if problem:
            why = next((why for variant, why in _STEP_MISTAKES.items() if all(
                _step_difference(run, _eager(c, variant), c) is None for run, c in zip(runs, STEP_CASES))), "")
            raise CheckFailed(f"with {case.label}: {problem}" + (f" -- {why}" if why else ""))
    return (f"forward, loss and optimizer step captured in {n_graphs} graph(s); losses and weights match eager "
            f"training on {len(STEP_CASES)} cases (a new batch every step, batch sizes that change, float32 and "
            "float64, cross-entropy, label smoothing and MSE)")


def _step_difference(got: tuple, want: tuple, case: Case) -> str | None:
    dtype = case.kwargs["dtype"]
    for i, (a, b) in enumerate(zip(got[0], want[0]), 1):
        problem = compare(a, b, f"step {i}'s loss", dtype=dtype, scale=10)
        if problem:
            return f"{problem} (eager training)"
    names = [n for n, _ in _tiny_run()[0].named_parameters()]
    for name, a, b in zip(names, got[1], want[1]):
        problem = compare(a, b, f"parameter {name} after {len(got[0])} steps", dtype=dtype, scale=10)
        if problem:
            return f"{problem} (eager training)"
    return None
