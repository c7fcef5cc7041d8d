"""Checkers of Jour 1's measuring tools: batch_sweep (``largest_batch``) and profiler (``profile_steps``),
registered by dlo.course.checks.jour1.

batch_sweep runs the answer and the reference on generated sweeps (dlo.course.checks.cases.seeded): lists of 1 to
6 ascending batch sizes (powers of two, odd sizes, a single size), the first out-of-memory error at every position
(the first size, a middle one, none at all), throughputs that peak before the last size that fits or at it, and
errors that are not out-of-memory (ValueError, RuntimeError) at the first size or later ones; compared: the sizes
tried, in order, the batch reported, the results returned, and the errors that must propagate.

profiler runs the answer on generated schedules (wait, warm-up and active counts from 0 or 1 to 3, all distinct in
some cases), with a step that marks its own index in the trace, and compares with the reference: how many times
the step ran, the steps the profiler saw, which steps were recorded, and that a trace file was written.
"""
from __future__ import annotations

import json
import random
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch

from dlo.course.checks.cases import Case, run_student, seeded
from dlo.course.checks.framework import expect


# --------------------------------------------------------------------------------------------------
# batch_sweep
# --------------------------------------------------------------------------------------------------

def reference_largest_batch(try_batch: Callable, batch_sizes: list[int]) -> tuple[Any, list]:
    results = []
    for bs in batch_sizes:
        try:
            results.append(try_batch(bs))
        except torch.OutOfMemoryError:
            break
    return (results[-1]["batch_size"] if results else None), results


def _sweep_case(sizes: list[int], oom_at: int, peak: int, bug: tuple[int, type] | None = None) -> Case:
    """``oom_at``: the index of the first size that does not fit (len(sizes): all fit); ``peak``: the index of the
    best throughput among those that fit; ``bug``: (index, exception type) of an error that is not out of memory."""
    label = (f"sizes {sizes}, " + (f"out of memory from {sizes[oom_at]}" if oom_at < len(sizes) else "all fit")
             + (f", the best throughput at {sizes[peak]}" if 0 < oom_at and peak < oom_at - 1 else "")
             + (f", a {bug[1].__name__} at {sizes[bug[0]]}" if bug else ""))
    return Case(label, {"sizes": sizes, "oom_at": oom_at, "peak": peak, "bug": bug}, size=len(sizes) + 10 * bool(bug))


def _sweep_draw(rng: random.Random) -> Case:
    n = rng.randint(1, 6)
    start = rng.choice([1, 3, 8, 16])
    sizes = sorted(set(start * 2 ** k if rng.random() < 0.6 else start + 2 * k + 1 for k in range(n)))
    oom_at = rng.randint(0, len(sizes))
    return _sweep_case(sizes, oom_at, rng.randint(0, max(oom_at - 1, 0)))


SWEEP_CASES = seeded(_sweep_draw, 12, seed=6, fixed=[
    _sweep_case([16, 32, 64, 128, 256], 3, 1), _sweep_case([8], 0, 0), _sweep_case([4, 8, 12], 3, 1),
    _sweep_case([2, 4, 8], 3, 2, bug=(1, ValueError)), _sweep_case([2, 4, 8], 3, 2, bug=(0, RuntimeError)),
    _sweep_case([2, 4, 8, 16], 4, 3, bug=(2, RuntimeError))])


def _try_batch(case: Case, tried: list[int]) -> Callable[[int], dict]:
    sizes, oom_at, peak, bug = (case.kwargs[k] for k in ("sizes", "oom_at", "peak", "bug"))

    def try_batch(bs: int) -> dict:
        tried.append(bs)
        i = sizes.index(bs) if bs in sizes else len(sizes)
        if bug and i == bug[0]:
            raise bug[1](f"a real bug at batch {bs}: shapes do not match")
        if i >= oom_at:
            raise torch.OutOfMemoryError(f"CUDA out of memory (simulated for batch {bs})")
        return {"batch_size": bs, "throughput": 100.0 + i - (50.0 if i > peak else 0.0) + (80.0 if i == peak else 0)}
    return try_batch


def _sweep_one(largest_batch: Callable, case: Case) -> None:
    sizes, bug = case.kwargs["sizes"], case.kwargs["bug"]
    tried: list[int] = []
    if bug:
        raised = None
        try:
            largest_batch(_try_batch(case, tried), list(sizes))
        except bug[1] as exc:
            raised = exc
        expect(raised is not None,
               f"with {case.label}: the {bug[1].__name__} did not propagate: catch only torch.OutOfMemoryError "
               "(`except RuntimeError` or `except Exception` is too broad: a real bug reads as 'out of memory')")
        return
    want_best, want_results = reference_largest_batch(_try_batch(case, []), list(sizes))
    got = run_student(lambda **kw: largest_batch(_try_batch(case, tried), list(sizes)), case)
    expect(not tried or tried[0] == sizes[0],
           f"with {case.label}: try the batch sizes in the order given, from the smallest (you tried {tried}): the "
           "sweep stops at the first one that does not fit")
    expect(isinstance(got, tuple) and len(got) == 2, f"with {case.label}: return the pair (largest batch, results), "
                                                     f"got {type(got).__name__}")
    best, results = got
    fits = [r["batch_size"] for r in want_results]
    by_throughput = max(want_results, key=lambda r: r["throughput"])["batch_size"] if want_results else None
    expect(not (best == by_throughput != want_best),
           f"with {case.label}: you reported the batch with the best throughput ({best}), not the largest batch "
           f"that fits ({want_best}): throughput can drop before memory runs out")
    expect(tried == sizes[:len(fits) + 1],
           f"with {case.label}: the sizes tried were {tried}, expected {sizes[:len(fits) + 1]}: "
           + ("stop at the first out-of-memory error" if len(tried) > len(fits) + 1 else "try every size in order "
              "until one does not fit"))
    expect(best == want_best, f"with {case.label}: the largest batch that fits is {want_best} here, got {best!r}"
           + (": when nothing fits, return (None, [])" if want_best is None else ""))
    shown = [r.get("batch_size") if isinstance(r, dict) else r for r in results] if isinstance(results, list) \
        else results
    expect(shown == fits, f"with {case.label}: return the results of the batches that fitted, in order (those of "
                          f"{fits}), got those of {shown}")
    expect(results == want_results, f"with {case.label}: return try_batch's results as they are")


def check_batch_sweep(largest_batch: Callable) -> str:
    for case in SWEEP_CASES:
        _sweep_one(largest_batch, case)
    return (f"OOM is caught (and only OOM), the sweep stops there and reports the largest batch that fit: the "
            f"reference's sizes tried, batch and results on {len(SWEEP_CASES)} generated sweeps")


# --------------------------------------------------------------------------------------------------
# profiler
# --------------------------------------------------------------------------------------------------

def reference_profile_steps(step: Callable, trace_dir: str, wait: int = 1, warmup: int = 1, active: int = 3):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                schedule=torch.profiler.schedule(wait=wait, warmup=warmup, active=active),
                                on_trace_ready=torch.profiler.tensorboard_trace_handler(str(trace_dir))) as prof:
        for _ in range(wait + warmup + active):
            step()
            prof.step()
    return prof


def _schedule_case(wait: int, warmup: int, active: int) -> Case:
    return Case(f"wait={wait}, warmup={warmup}, active={active}", {"wait": wait, "warmup": warmup, "active": active},
                size=wait + warmup + active)


PROFILE_CASES = seeded(lambda rng: _schedule_case(rng.randint(0, 3), rng.randint(1, 3), rng.randint(1, 3)), 2,
                       seed=7, fixed=[_schedule_case(1, 1, 2), _schedule_case(0, 1, 1), _schedule_case(2, 1, 3),
                                      _schedule_case(3, 2, 1)])
_MARK = "dlo_check_step_"


def _profile_one(profile_steps: Callable, case: Case) -> dict[str, Any]:
    """Run ``profile_steps`` on a step that marks its index: how often it ran, the steps the profiler saw, the
    indices recorded in the trace, and the trace files written."""
    calls: list[int] = []
    a = torch.randn(16, 16)

    def step() -> None:
        with torch.profiler.record_function(f"{_MARK}{len(calls)}"):
            calls.append(1)
            (a @ a).sum()

    with tempfile.TemporaryDirectory() as d:
        prof = run_student(lambda **kw: profile_steps(step, d, **kw), case)
        traces = list(Path(d).rglob("*.json"))
        recorded = sorted({int(name[len(_MARK):]) for t in traces for name in _event_names(t) if name.startswith(_MARK)})
    return {"prof": prof, "ran": len(calls), "step_num": getattr(prof, "step_num", 0), "recorded": recorded,
            "traces": bool(traces)}


def _event_names(trace: Path) -> set[str]:
    """The names of the events of a Chrome/TensorBoard trace file (none when it is not one)."""
    try:
        events = json.loads(trace.read_text()).get("traceEvents", [])
    except (ValueError, AttributeError, OSError):
        return set()
    return {e.get("name", "") for e in events if isinstance(e, dict)}


def check_profiler(profile_steps: Callable) -> str:
    for case in PROFILE_CASES:
        wait, warmup, active = (case.kwargs[k] for k in ("wait", "warmup", "active"))
        total, want = wait + warmup + active, list(range(wait + warmup, wait + warmup + active))
        got = _profile_one(profile_steps, case)
        expect(got["ran"] == total, f"with {case.label}: step() ran {got['ran']} time{'s' * (got['ran'] != 1)}: the schedule needs wait + "
                                    f"warmup + active = {total} steps, the first ones skipped")
        expect(got["prof"] is not None and hasattr(got["prof"], "key_averages"),
               f"with {case.label}: your function returned {type(got['prof']).__name__}, not the profiler")
        expect(got["step_num"] != 0 or total == 0,
               f"with {case.label}: the profiler saw 0 steps, expected {total}: the schedule only advances when told "
               f"after each step (prof.step()), so it never reached the active steps")
        expect(got["step_num"] == total, f"with {case.label}: the profiler was told of {got['step_num']} steps, "
                                         f"expected {total}: tell it once after each step")
        expect(got["traces"], f"with {case.label}: no trace file was written into trace_dir: the profiler needs a "
                              "handler that writes the TensorBoard trace when the active steps end "
                              "(tensorboard_trace_handler)")
        early = [k for k in got["recorded"] if k < wait + warmup]
        missing = [k for k in want if k not in got["recorded"]]
        expect(got["recorded"] == want,
               f"with {case.label}: the trace holds steps {got['recorded']} (counting from 0), the schedule you were "
               f"given asks for the {active} active ones, {want}"
               + (f": the first steps {early}, slow and skipped on purpose, are in it" if early else "")
               + (f"{' and' if early else ':'} steps {missing} are missing" if missing else ""))
    return (f"trace written for TensorBoard/Perfetto with the wait/warm-up/active schedule asked for: the steps "
            f"recorded are the reference's on {len(PROFILE_CASES)} generated schedules")
