"""The plumbing of Jour 1 (jour1.ipynb) kept out of the lesson: the student's timer set beside the library's, the
fp16 loss-scale demonstration, the ladder's table, the sentences about the re-tries, the good-practice table and the
summary. Every sentence that states a measured outcome is written from the decision rule
(:func:`dlo.measure.verdicts.conclude`, which records it in ``results["conclusions"]``) or from the ladder's decisions.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import pandas as pd
import torch

from dlo.measure import bench, verdicts
from dlo.measure.bench import Measurement
from dlo.measure.decide import decide
from dlo.measure.records import table, cpu_has_native_bf16


# --------------------------------------------------------------------------------------------------
# Your timer beside dlo.measure.bench
# --------------------------------------------------------------------------------------------------

def compare_timers(results: dict[str, Any], time_step: Callable, call: Callable[[], Any], *, device: torch.device,
                   items: int, warmup: bench.Warmup | int, rounds: int, timer: bench.Timer | None = None) -> str:
    """Time ``call`` with the student's ``time_step`` and with :mod:`dlo.measure.bench`'s timer in turns (one
    call each per round, after a shared warm-up), and say whether they agree, by the decision rule. ``timer``
    replaces the library's clock (tests)."""
    library = timer or bench.make_timer(device)
    warm, steady = bench.warm_up(call, warmup, timer=library)
    sync = lambda: bench.synchronize(device)  # noqa: E731
    mine, theirs = [], []
    for r in range(rounds):  # A B, B A, ...: a drift of the machine hits both alike
        for who in ((0, 1) if r % 2 == 0 else (1, 0)):
            if who == 0:
                mine.append(float(time_step(call, sync, warmup=0, repeats=1)[0]))
            else:
                theirs.append(float(library(call)))
    common = dict(items_per_call=items, device=str(device), warmup=len(warm), steady=steady, warmup_times_s=warm)
    a = Measurement("step 0 timed by your time_step", mine, **common)
    b = Measurement("step 0 timed by dlo.measure.bench", theirs, **common)
    sentence = verdicts.conclude(results, a, b)
    outcome = decide(a, b).outcome
    verdict = {"same": "**They agree.**", "undecided": "**No difference between them could be shown** in "
               f"{rounds} rounds.", "unsteady": "**No verdict:** the step was not steady."}.get(
        outcome, "**They disagree:** one of the two timers does not measure the step alone.")
    results["timer_agreement"] = outcome
    return f"{verdict} {sentence}"


# --------------------------------------------------------------------------------------------------
# Step 2b: what unscale_ changes
# --------------------------------------------------------------------------------------------------

def _norm(model: torch.nn.Module) -> float:
    return torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None]).item()


def unscale_demo(results: dict[str, Any], model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 criterion: Callable, batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
                 train_step_fp16_clip: Callable, device: torch.device) -> str:
    """The gradient norm right after a scaled fp16 backward and after ``unscale_`` (what clipping must see), then
    a few clipped steps with the student's ``train_step_fp16_clip``; recorded in ``results["fp16_clip"]``."""
    scaler = torch.amp.GradScaler(device.type)
    xb, yb = batches[0]
    with torch.autocast(device_type=device.type, dtype=torch.float16):
        loss = criterion(model(xb), yb)
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    scale_used = scaler.get_scale()
    scaled_norm = _norm(model)
    scaler.unscale_(optimizer)
    true_norm = _norm(model)
    scaler.step(optimizer)
    scaler.update()
    if math.isfinite(scaled_norm) and true_norm > 0:
        lines = [f"gradient norm after the scaled backward: {scaled_norm:.4g}; after unscale_: {true_norm:.4g} "
                 f"(ratio {scaled_norm / true_norm:.0f}, the loss scale was {scale_used:.0f})"]
    else:
        lines = [f"the scaled backward overflowed at scale {scale_used:.0f} (gradient norm {scaled_norm}): "
                 f"scaler.step skipped this step and update() lowered the scale to {scaler.get_scale():.0f}"]
    clip_at = true_norm / 2 if math.isfinite(true_norm) and true_norm > 0 else 1.0
    losses = [train_step_fp16_clip(model, x, y, optimizer, criterion, scaler, clip_at).item() for x, y in batches]
    after = _norm(model)
    results["fp16_clip"] = {"scale": scale_used, "scaled_norm": scaled_norm, "true_norm": true_norm,
                            "max_norm": clip_at, "norm_after_clipping": after, "losses": losses}
    lines.append(f"fp16 + clipping at max_norm={clip_at:.4g}: losses {[round(v, 3) for v in losses]}, gradient norm "
                 f"after the last step {after:.4g}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# The ladder's table, and what it kept
# --------------------------------------------------------------------------------------------------

_COLUMNS = ["step", "batch", "decision", "vs best so far (timed with it)", "best so far", "throughput",
            "noise band (IQR)", "rounds", "median_s", "steady", "warm-up calls", "peak_memory_bytes", "why"]


def ladder_view(lad: verdicts.Ladder, title: str, path: Any = None) -> tuple[Any, Any]:
    """The ladder's rows as a styled table and its chart; each ratio is the one its decision gave, against the best
    configuration so far timed together with the step ("undecided" / "unsteady": no ratio)."""
    df = lad.table()
    band = [f"{lo:,.1f} - {hi:,.1f}" if ok else "" for lo, hi, ok in zip(df["throughput_low"], df["throughput_high"],
                                                                        df["applicable"])]
    view = df.assign(**{"noise band (IQR)": band}).rename(
        columns={"vs_best_text": "vs best so far (timed with it)", "best_step": "best so far", "repeats": "rounds",
                 "warmup": "warm-up calls", "batch_size": "batch"})
    styled = view[[c for c in _COLUMNS if c in view]].style.format(
        {"throughput": "{:,.1f}", "median_s": "{:.4f}", "warm-up calls": "{:.0f}", "rounds": "{:.0f}",
         "peak_memory_bytes": lambda b: "" if pd.isna(b) else f"{b / 2**20:,.0f} MiB"}, na_rep="")
    return styled, verdicts.plot_ladder(df[df.applicable], label="step", title=title, path=path)


def ladder_outcome(lad: verdicts.Ladder, device: torch.device) -> str:
    """What the ladder kept and left out on this machine, from its decisions (no claim of what "usually" helps)."""
    rows = [r for r in lad.rows if r["decision"] != "baseline" and not r.get("retry_of")]
    kept = [r["step"] for r in rows if r["kept"]]
    out = [f"{r['step']} ({r['decision']})" for r in rows if r["applicable"] and not r["kept"]]
    na = [r["step"] for r in rows if not r["applicable"]]
    parts = [f"On this machine ({device.type}) the ladder kept: {', '.join(kept) or 'no step'}."]
    if out:
        parts.append(f"Left out: {', '.join(out)}.")
    if na:
        parts.append(f"Not applicable here: {', '.join(na)}.")
    return " ".join(parts)


# --------------------------------------------------------------------------------------------------
# Step 6b: the re-tries at the chosen batch
# --------------------------------------------------------------------------------------------------

def retry_report(results: dict[str, Any], lad: verdicts.Ladder, retries: list[dict[str, Any]], *,
                 bf16_step: str, batch: int, retry_at: int, compile_s: float, device: torch.device) -> str:
    """One sentence per re-tried step (both batches, :func:`dlo.measure.verdicts.conclude`, kind "retry"), then
    what the re-tries show on this machine, from their decisions (recorded as ``results["retry_lesson"]``)."""
    said = []
    for row in retries:
        first = next(r for r in lad.rows if r["step"] == row["retry_of"])
        if not row["applicable"]:
            said.append(f"- {row['retry_of']}: {row['reason']}.")
            continue
        said.append("- " + verdicts.conclude(results, row, row["reference"], kind="retry", first=first,
                                             first_reference=first["reference"], label=row["retry_of"],
                                             first_batch=row["first_batch"], batch=row["batch_size"],
                                             reference_batch=row["reference_batch"]) + f" Decision: **{row['decision']}**.")
        if row.get("compile"):
            said[-1] += (f" Its first call, compiling again for batch {retry_at}, took {row['warmup_times_s'][0]:.1f} s "
                         f"(at batch {batch}: {compile_s:.1f} s).")
    lesson = _retry_lesson(lad, retries, bf16_step=bf16_step, batch=batch, retry_at=retry_at, device=device)
    results["retry_lesson"] = lesson
    return "\n".join(said) + ("\n\n" + lesson if lesson else "")


def _retry_lesson(lad: verdicts.Ladder, retries: list[dict[str, Any]], *, bf16_step: str, batch: int, retry_at: int,
                  device: torch.device) -> str:
    paid = [r["retry_of"] for r in retries if r["kept"]]
    unclear = [r["retry_of"] for r in retries if r["applicable"] and r["decision"].startswith(("undecided", "not steady"))]
    lesson = []
    if paid:
        one = len(paid) == 1
        lesson.append(f"On this machine the batch changed the outcome: {', '.join(paid)} {'was' if one else 'were'} "
                      f"not kept at batch {batch} (the sentences above say why) but {'was' if one else 'were'} faster "
                      f"at batch {retry_at}, so the final configuration has {'it' if one else 'them'}.")
    elif unclear:
        lesson.append(f"At batch {retry_at} the re-tries of {', '.join(unclear)} could not be decided on this machine "
                      "(undecided or not steady), so nothing was kept, and whether they pay here stays open.")
    elif any(r["applicable"] for r in retries):
        lesson.append(f"On this machine no step left out at batch {batch} paid at batch {retry_at} either.")
    first = next((r for r in lad.rows if r["step"] == bf16_step), None)
    again = next((r for r in retries if r["retry_of"] == bf16_step and r["applicable"]), None)
    if first is not None and again is not None and device.type == "cpu" and not cpu_has_native_bf16():
        slower = first["decision"] == "slower" and again["decision"] == "slower"
        lesson.append(f"This CPU (`{torch.backends.cpu.get_cpu_capability()}`) has no native bf16 instructions" + (
            f": bf16 was slower at batch {batch} and still slower at batch {retry_at}, as emulated bf16 is at any "
            "batch." if slower else
            f"; bf16 was measured {first['decision']} at batch {batch} and {again['decision']} at batch {retry_at} "
            "(the sentence above gives the numbers)."))
    return " ".join(lesson)


# --------------------------------------------------------------------------------------------------
# Good practice, and the summary
# --------------------------------------------------------------------------------------------------

def good_practice_report(results: dict[str, Any], good: dict[str, dict[str, Measurement]]) -> tuple[Any, str]:
    """The table of each practice's before/after pair (the ratio is the one the decision rule gave for the pair)
    and one sentence per practice (:func:`dlo.measure.verdicts.conclude`). Returns (styled table, markdown)."""
    lines, records = [], []
    for practice, ms in good.items():
        lines.append(f"- **{practice}**: " + verdicts.conclude(results, ms["after"], ms["before"]))
        records.extend({"practice": practice, "version": when, **m.to_record()} for when, m in ms.items())
    gdf = table(records)
    decided = {p: verdicts.decide(ms["after"], ms["before"]) for p, ms in good.items()}
    gdf["decision"] = [decided[p].outcome if v == "after" else "" for p, v in zip(gdf["practice"], gdf["version"])]
    gdf["vs before"] = ["reference" if v == "before" else verdicts.format_ratio(decided[p].ratio)
                        if decided[p].ratio is not None else decided[p].outcome
                        for p, v in zip(gdf["practice"], gdf["version"])]
    results["good_practice_decisions"] = {p: d.outcome for p, d in decided.items()}
    results["good_practice"] = gdf.to_dict("records")
    gdf["noise band (IQR)"] = [f"{lo:,.0f} - {hi:,.0f}" for lo, hi in zip(gdf["throughput_low"], gdf["throughput_high"])]
    cols = ["practice", "name", "decision", "vs before", "throughput", "noise band (IQR)", "repeats", "median_s",
            "steady", "parameters", "peak_memory_bytes"]
    styled = gdf[[c for c in cols if c in gdf]].style.format(
        {"throughput": "{:,.0f}", "median_s": "{:.4f}", "parameters": "{:,.0f}",
         "peak_memory_bytes": lambda b: f"{b / 2**20:,.0f} MiB"}, na_rep="")
    return styled, "Measured here:\n\n" + "\n".join(lines)


def summary(results: dict[str, Any], lad: verdicts.Ladder, *, sweep: pd.DataFrame, compile_s: float,
            path: str) -> str:
    """After :meth:`Ladder.final_comparison`: the headline (final configuration against the fp32 baseline of its
    own device, decided), the CPU as context only, the ladder's records put in ``results``; returns the markdown."""
    s = lad.summary()
    names = lad.labels()
    if lad.final is not None:
        headline = verdicts.conclude(results, lad.final["final"], lad.final["baseline"], a_label=names["final"],
                                     b_label=names["baseline"])
    else:
        headline = s["final_sentence"]
    context = ""
    if "start_step" in s:  # another device before this one (the CPU): context, not the headline
        a, c = (lad.final["final"], lad.final["start"]) if lad.final and "start" in lad.final else (lad.best(),
                                                                                                    lad.baseline())
        context = "For context only: " + verdicts.conclude(results, a, c, a_label=names["final"],
                                                           b_label=names["start"])
    results.update(ladder=lad.table().to_dict("records"), batch_sweep=sweep.to_dict("records"),
                   compile_seconds=compile_s,
                   final_comparison={k: m.to_record() for k, m in (lad.final or {}).items()}, **s)
    return (f"{headline} Final configuration `{s['final_config']}` at batch {s['final_batch_size']} (last kept step: "
            f"{s['final_step']}). {s['final_status_sentence']} {context} Steps not kept here: "
            f"{', '.join(s['steps_not_kept']) or 'none'}. Results: `{path}`")


def top_operator(prof: Any, device: torch.device) -> str:
    """Which operator took the most time in the profile (self time, on the device where there is one)."""
    events = [e for e in prof.key_averages() if not e.key.startswith("ProfilerStep")]
    if not events:
        return "The profile recorded no operator."
    key = "self_cpu_time_total"
    if device.type == "cuda":  # the name of the device-time column changed across torch versions
        key = next((k for k in ("self_device_time_total", "self_cuda_time_total") if hasattr(events[0], k)), key)
    total = sum(getattr(e, key, 0) for e in events) or 1
    top = max(events, key=lambda e: getattr(e, key, 0))
    return (f"In this profile the operator with the most self time is `{top.key}`: "
            f"{getattr(top, key, 0) / total:.0%} of the recorded {'GPU' if device.type == 'cuda' else 'CPU'} self time.")
