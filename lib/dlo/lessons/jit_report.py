"""The measuring cells of the JIT notebook (Jour3/jit.ipynb), out of the student's way.

- :func:`time_train_steps`: an eager and a compiled training step, each built on the same fresh model, timed
  first call apart (compilation included) then in alternation;
- :func:`break_even`: compile time against time per step, where the break-even in steps is given only when the
  decision rule (:func:`dlo.measure.decide.decide`) finds the compiled step faster: otherwise "never" (not faster
  beyond the noise) or "undecided", as the sentence recorded by ``conclude(kind="break_even")`` says;
- :func:`time_fusion`: the fused and unfused bias + GELU timed interleaved, compared by the decision rule.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping

import torch

from dlo.lessons import jit
from dlo.measure import bench
from dlo.measure.decide import decide, pair_decider
from dlo.measure.verdicts import conclude


def time_train_steps(fresh_run: Callable[[], tuple[torch.nn.Module, torch.optim.Optimizer]],
                     makers: Mapping[str, Callable[..., Callable]], xs: torch.Tensor, ys: torch.Tensor,
                     loss_fn: Callable, *, warmup: int, repeats: int, device: torch.device) -> dict[str, Any]:
    """Each of ``makers`` (``{"eager": make_eager_step, "compiled": make_compiled_step}``) builds a step on a fresh
    model from ``fresh_run()``; its first call is timed alone, its first 3 losses kept, then all steps are timed in
    alternation. Returns ``{"steps": {name: FirstAndSteady}, "losses": {name: tensor}, "cache": {...}}`` (the
    inductor on-disk cache's counters that moved during these compilations)."""
    cache_before = dict(torch._dynamo.utils.counters["inductor"])
    step_fns, first, losses = {}, {}, {}
    for name, make in makers.items():
        model, opt = fresh_run()
        step_fns[name] = make(model, opt, loss_fn)
        with jit.captured_warnings():
            first[name], first_loss = jit.time_first_call(lambda: step_fns[name](xs, ys), device)
            losses[name] = torch.stack([first_loss] + [step_fns[name](xs, ys) for _ in range(2)]).cpu()
    with jit.captured_warnings():
        times = jit.time_interleaved({name: (lambda f=f: f(xs, ys)) for name, f in step_fns.items()},
                                     warmup=warmup, repeats=repeats, device=device, progress="steps")
    cache = {k: v - cache_before.get(k, 0) for k, v in torch._dynamo.utils.counters["inductor"].items()
             if "fxgraph_cache" in k and v - cache_before.get(k, 0)}
    return {"steps": {name: jit.FirstAndSteady(first[name], times[name], warmup) for name in step_fns},
            "losses": losses, "cache": cache}


def step_record(step: "jit.FirstAndSteady", name: str, items: int, unit: str = "img/s") -> dict[str, Any]:
    """A :class:`~dlo.lessons.jit.FirstAndSteady` as a measurement record the decision rule reads."""
    return {**step.to_record(), "name": f"the {name} step", "items_per_call": items, "unit": unit}


def break_even(results: dict[str, Any], steps: Mapping[str, "jit.FirstAndSteady"], *, batch: int, title: str,
               path: Any = None) -> dict[str, Any]:
    """Compile time (first call beyond a steady step, compiled minus eager) against the steady steps: the sentence
    (recorded in ``results["conclusions"]``), the decision's outcome, the break-even in steps (None unless the
    compiled step is faster by the rule) and the plot, which marks a break-even only then."""
    eager, compiled = steps["eager"], steps["compiled"]
    compile_s = max(compiled.overhead_s - eager.overhead_s, 0.0)
    a, b = step_record(compiled, "compiled", batch), step_record(eager, "eager", batch)
    sentence = conclude(results, a, b, kind="break_even", compile_seconds=compile_s)
    outcome = decide(a, b).outcome
    n_star = jit.break_even_steps(compile_s, eager.median_s, compiled.median_s) if outcome == "faster" else math.inf
    described = jit.describe_steps(n_star) if outcome == "faster" else {
        "slower": "never (slower)", "same": "never (not faster beyond the noise)", "undecided": "undecided",
        "unsteady": "not measured steadily"}[outcome]
    note = None if outcome == "faster" else f"the compiled step is {described}:\nno break-even is given"
    fig = jit.plot_break_even(compile_s, eager.median_s, compiled.median_s, title=title, path=path, note=note)
    return {"compile_s": compile_s, "outcome": outcome, "sentence": sentence, "figure": fig,
            "break_even_steps": n_star if math.isfinite(n_star) else None, "described": described}


def time_fusion(results: dict[str, Any], impls: Mapping[str, Callable], x: torch.Tensor, b: torch.Tensor, *,
                fused: str, eager: str, useful_bytes: int, repeats: int,
                device: torch.device) -> tuple[list[dict[str, Any]], str]:
    """Time ``impls`` (``{name: fn(x, b)}``) interleaved, adding rounds (up to 4x ``repeats``) until the rule
    decides ``fused`` against ``eager``; record that sentence in ``results["conclusions"]`` and return it with one
    row per implementation: median, spread and ``useful_GB_per_s`` (``useful_bytes`` / median)."""
    ms = bench.measure_interleaved([bench.Candidate(name, (lambda f=fn: f(x, b)), 1, device)
                                    for name, fn in impls.items()], repeats=repeats, max_repeats=4 * repeats,
                                   until=pair_decider(fused, eager), unit="calls/s", track_memory=False,
                                   progress=False)
    sentence = conclude(results, ms[fused], ms[eager], a_label=fused, b_label=eager)
    return [{"implementation": name, "median_ms": m.median_s * 1e3, "spread": m.spread, "repeats": len(m.times_s),
             "useful_GB_per_s": useful_bytes / m.median_s / 1e9} for name, m in ms.items()], sentence
