"""The optimisation ladder: a sequence of optimisation steps, each timed interleaved with the fastest configuration
so far and kept only when the decision rule (:func:`dlo.measure.decide.decide`) says "faster"; the steps left out
tried again at the batch the sweep chose; the headline against the fp32 baseline of the same device; and the
ladder's table and chart, where every ratio comes from the decision and the reference measurement behind it.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import torch
from dlo.measure.bench import Candidate, Measurement, Timer, Warmup, measure_interleaved
from dlo.measure.decide import DECISIONS, decide, pair_decider as _pair_clear, unsteady_reason
from dlo.measure.sentences import compare_sentence, format_ratio, retry_sentence

#: How a step's first decision reads in the "why" of its retry ("re-tried at batch 8192: not faster beyond the
#: noise at batch 256").
_FIRST_DECISION = {"not faster beyond noise": "not faster beyond the noise", "slower": "slower",
                   "not steady: not kept": "not steady", "undecided: not kept": "undecided",
                   "kept": "kept, then left out by a later step"}


class Ladder:
    """An optimisation ladder: each step is measured against the fastest configuration so far and *kept*
    only if it beats it on this machine (a change that helps on a GPU can hurt on a CPU).

    **Keep rule.** A step is kept only when the decision rule (:func:`dlo.measure.decide.decide`) says it is
    faster than the best so far: an exact rank test on the repeats at a 1 % false-positive rate, a gain of at
    least 3 %, both measurements steady (:func:`unsteady_reason`). With :meth:`try_step` both are timed
    interleaved (A B, B A, ...) in the same run, with more rounds up to ``max_repeats`` while the decision is
    not clear; the table's ``decision`` column says "kept", "not faster beyond noise", "slower",
    "undecided: not kept", "not steady: not kept" or "not applicable". Four no-op steps keep one in at most
    about 4 % of ladders (a test runs it).

    **Re-trying at the chosen batch.** Whether a step pays depends on the batch: on a large GPU a small batch
    leaves the step launch-bound (the GPU waits for the CPU to issue kernels), and then neither bf16 nor
    compilation can speed it up; at a batch that fills the GPU they can. Once the ladder has kept a larger
    batch, :meth:`retry` tries every step that is not in the configuration again at that batch, each against
    the best configuration so far at that batch, with the same keep rule.

    **Headline.** The final configuration is compared with the fp32 baseline *on its own device*
    (:meth:`device_baseline`: the first measured step on that device, e.g. "GPU fp32" on a GPU, the CPU
    baseline on a CPU-only machine), never with another device; :meth:`final_comparison` times the two again,
    interleaved, and :meth:`summary` refuses a speed-up whose measurements are not steady.

    ``current`` is the configuration the next step builds on (give ``batch_size`` in it, so that each row
    knows its batch). :meth:`try_step` measures a step (given as a call) against the best so far and records
    it; :meth:`record` adds a row from a Measurement already taken (compared with the best row as it was
    measured then), or ``None`` with a reason when the step does not apply here. Each row keeps ``change``,
    the part of its configuration that differs from the configuration it was tried on.
    """

    #: Configuration keys whose change is not a step to re-try at another batch (the batch itself, the device).
    NOT_RETRIED = ("batch_size", "device")

    def __init__(self, **initial_config: Any) -> None:
        self.rows: list[dict[str, Any]] = []
        self.current: dict[str, Any] = dict(initial_config)
        self.final: dict[str, Measurement] | None = None
        self._calls: dict[str, Candidate] = {}

    def best(self) -> dict[str, Any] | None:
        """The last kept row: each kept step beat the best before it."""
        kept = [r for r in self.rows if r["kept"]]
        return kept[-1] if kept else None

    def baseline(self) -> dict[str, Any] | None:
        """The ladder's first measured step (e.g. "CPU fp32")."""
        measured = [r for r in self.rows if r["applicable"]]
        return measured[0] if measured else None

    def device_baseline(self) -> dict[str, Any] | None:
        """The first measured step on the device of the best configuration: the fp32 baseline every speed-up
        of the final configuration is measured against (on a GPU the "GPU fp32" step, not the CPU one; on a
        CPU-only machine the CPU baseline)."""
        best = self.best()
        if best is None:
            return self.baseline()
        same = [r for r in self.rows if r["applicable"] and r.get("device") == best.get("device")]
        return same[0] if same else self.baseline()

    def try_step(self, step: str, call: Callable[[], Any], *, items_per_call: int, device: torch.device | str = "cpu",
                 config: Mapping[str, Any] | None = None, repeats: int = 5, warmup: Warmup | int = Warmup(),
                 unit: str = "img/s", track_memory: bool = True, progress: bool = True, timer: Timer | None = None,
                 max_repeats: int | None = None, **extra: Any) -> dict[str, Any]:
        """Measure ``call`` (one step of the configuration ``config``) interleaved with the best
        configuration so far, then record it (see the keep rule). The first step is the baseline."""
        if step in self._calls or any(r["step"] == step for r in self.rows):
            raise ValueError(f"step {step!r} is already in the ladder: give each step its own name")
        cand = Candidate(step, call, items_per_call, str(device), dict(extra))
        best = self.best()
        opts = dict(repeats=repeats, warmup=warmup, unit=unit, track_memory=track_memory, progress=progress,
                    timer=timer, max_repeats=max_repeats)
        if best is None:
            ms = measure_interleaved([cand], **opts)
            row = self.record(step, ms[step], **dict(config or {}))
        else:
            if best["step"] not in self._calls:
                raise ValueError(f"the best step so far, {best['step']!r}, was recorded without its call: "
                                 f"measure it with try_step to compare with it")
            ms = measure_interleaved([self._calls[best["step"]], cand], **opts)
            row = self.record(step, ms[step], reference=ms[best["step"]], **dict(config or {}))
        self._calls[step] = cand  # kept or not: the final comparison may need the baseline of its device
        return row

    def record(self, step: str, measurement: Measurement | None = None, reason: str | None = None, *,
               reference: Measurement | None = None, **config: Any) -> dict[str, Any]:
        """Add a row. ``reference``: the best configuration timed together with ``measurement`` (by
        :meth:`try_step`); without it the comparison uses the best row as it was measured earlier."""
        change = {k: v for k, v in config.items() if k not in self.current or self.current[k] != v}
        row: dict[str, Any] = {"step": step, "applicable": measurement is not None, "reason": reason,
                               "kept": False, "decision": "not applicable", **config, "change": change}
        row.setdefault("batch_size", self.current.get("batch_size"))
        if measurement is None:
            if not reason:
                raise ValueError(f"step {step!r}: give a measurement, or the reason it does not apply here")
            print(f"{step}: not applicable here -- {reason}")
            self.rows.append(row)
            return row
        row.update(measurement.to_record())
        best = self.best()
        if best is None:
            row.update(kept=True, decision="baseline")
            note = unsteady_reason(measurement)
            if note:
                row["note"] = note
        else:
            ref = reference.to_record() if reference is not None else {k: v for k, v in best.items() if k != "reference"}
            ref["name"] = ref.get("name") or best["step"]
            row["reference"] = ref
            row["best_step"] = best["step"]
            row["conclusion"] = compare_sentence(measurement, ref)
            d = decide(measurement, ref)
            # no ratio from a measurement that is not steady, nor from an undecided comparison: vs_best stays None
            row.update(decision=DECISIONS[d.outcome], kept=d.outcome == "faster", vs_best=d.ratio,
                       ratio_low=d.low, ratio_high=d.high, decision_reason=d.reason)
            if d.outcome in ("unsteady", "undecided"):
                row["note"] = d.reason
        if row["kept"]:
            self.current.update(config)
        print(measurement, f"-> {row['decision']}")
        self.rows.append(row)
        return row

    # ----------------------------------------------------------------------------------------------
    # Re-trying the steps left out, at the chosen batch
    # ----------------------------------------------------------------------------------------------

    def dropped(self) -> list[dict[str, Any]]:
        """The measured steps whose change is not in the current configuration: not kept (slower, within the
        noise, not steady), or kept and then undone by a later step. Not the baseline, not the changes of
        batch or device (:data:`NOT_RETRIED`), not the retries themselves."""
        out = []
        for r in self.rows:
            change = r.get("change") or {}
            if not r["applicable"] or r.get("retry_of") or not change or r is self.baseline():
                continue
            if any(k in change for k in self.NOT_RETRIED):
                continue
            if any(self.current.get(k) != v for k, v in change.items()):
                out.append(r)
        return out

    def retry(self, make_call: Callable[[dict[str, Any], int], Callable[[], Any]], batch: int | None = None, *,
              skip: Mapping[str, str] | None = None, items_per_call: int | None = None,
              device: torch.device | str = "cpu", repeats: int = 5, warmup: Warmup | int = Warmup(),
              unit: str = "img/s", track_memory: bool = True, progress: bool = True, timer: Timer | None = None,
              errors: tuple[type[BaseException], ...] = (torch.OutOfMemoryError,),
              max_repeats: int | None = None) -> list[dict[str, Any]]:
        """Try every :meth:`dropped` step again at ``batch`` (default: the batch of the current configuration,
        i.e. the one the batch sweep kept), in ladder order, each on top of the best configuration so far.

        ``make_call(config, batch)`` builds one training step of ``config`` at ``batch`` (a fresh model, a
        batch of that size) and returns a call without arguments. Each retry is timed interleaved with the best
        configuration so far (its own call: at ``batch`` once the ladder kept that batch, else at the batch it
        was kept at; throughputs per image compare across batches) and kept only beyond the noise, as any step;
        a kept retry is the best configuration for the next one. Returns the new rows: ``step`` "retry: <step> at batch <batch>", ``retry_of``,
        ``first_batch``, ``retry_why`` ("re-tried at batch 8192: not faster beyond the noise at batch 256") and
        ``conclusion`` (:func:`retry_sentence`, both outcomes). Steps named in ``skip`` get a row saying why
        they were not re-tried; a retry that raises one of ``errors`` (out of memory) gets a "failed" row.
        Steps already tried at ``batch`` are not tried again."""
        batch = batch if batch is not None else self.current.get("batch_size")
        if not isinstance(batch, int) or batch < 1:
            raise ValueError(f"retry needs the batch to re-try at (a positive integer), got {batch!r}: give "
                             "batch=, or batch_size in the ladder's configuration")
        skip = dict(skip or {})
        items = items_per_call if items_per_call is not None else batch
        opts = dict(repeats=repeats, warmup=warmup, unit=unit, track_memory=track_memory, progress=progress,
                    timer=timer, max_repeats=max_repeats)
        new_rows = []
        done = {r["retry_of"] for r in self.rows if r.get("retry_of") and r.get("batch_size") == batch}
        for first in self.dropped():
            first_batch = first.get("batch_size")
            if first_batch == batch or first["step"] in done:
                continue
            name = f"retry: {first['step']} at batch {batch}"
            why = (f"re-tried at batch {batch}: {_FIRST_DECISION.get(first['decision'], first['decision'])} "
                   f"at batch {first_batch}")
            info = {"retry_of": first["step"], "first_batch": first_batch, "retry_why": why}
            if first["step"] in skip:
                row = {"step": name, "applicable": False, "kept": False, "decision": "not re-tried",
                       "reason": f"not re-tried at batch {batch}: {skip[first['step']]}", "batch_size": batch, **info}
                print(f"{name}: {row['reason']}")
                self.rows.append(row)
                new_rows.append(row)
                continue
            best = self.best()
            if best is None or best["step"] not in self._calls:
                raise ValueError("the best step so far was recorded without its call: measure it with try_step")
            reference = self._calls[best["step"]]
            config = {**self.current, **first["change"], "batch_size": batch}
            cand = Candidate(name, make_call(config, batch), items, str(device))
            try:
                ms = measure_interleaved([reference, cand], **opts)
            except errors as exc:
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                row = {"step": name, "applicable": False, "kept": False, "decision": "failed",
                       "reason": f"{why}; it failed: {type(exc).__name__}: {text}"[:300], "batch_size": batch, **info}
                print(f"{name}: {row['reason']}")
                self.rows.append(row)
                new_rows.append(row)
                continue
            row = self.record(name, ms[name], reference=ms[reference.name], **config)
            row.update(info, reference_batch=best.get("batch_size"))
            row["conclusion"] = retry_sentence(ms[name], ms[reference.name], first=first,
                                               first_reference=first.get("reference") or first,
                                               label=first["step"], first_batch=first_batch, batch=batch,
                                               reference_batch=best.get("batch_size"))
            self._calls[name] = cand
            new_rows.append(row)
        if not new_rows:
            print(f"nothing to re-try at batch {batch}: every step is in the configuration or was tried at that batch")
        return new_rows

    # ----------------------------------------------------------------------------------------------
    # The headline
    # ----------------------------------------------------------------------------------------------

    def final_comparison(self, *, repeats: int = 5, warmup: Warmup | int = Warmup(), unit: str = "img/s",
                         track_memory: bool = False, progress: bool = True, timer: Timer | None = None,
                         context: bool = True, max_repeats: int | None = None) -> dict[str, Measurement] | None:
        """Time the fp32 baseline of the final configuration's device (:meth:`device_baseline`) and the final
        configuration again, interleaved, for the headline speed-up (numbers taken at the same time, not at both
        ends of the run). With ``context``, the ladder's first step when it ran on another device (the CPU
        baseline of a GPU ladder) is timed with them, for a comparison given as context only. Returns
        ``{"final": ..., "baseline": ...[, "start": ...]}`` (also kept in ``self.final`` for :meth:`summary`),
        or None when the final configuration is that baseline."""
        base, best, start = self.device_baseline(), self.best(), self.baseline()
        if base is None:
            raise ValueError("the ladder has no measured step yet")
        if best is base:
            self.final = None
            return None
        steps = [base["step"], best["step"]]
        if context and start is not base and start["step"] in self._calls:
            steps.append(start["step"])
        missing = [s for s in steps[:2] if s not in self._calls]
        if missing:
            raise ValueError(f"step(s) {missing} were recorded without their call: measure them with try_step")
        ms = measure_interleaved([self._calls[s] for s in steps], repeats=repeats, warmup=warmup, unit=unit,
                                 track_memory=track_memory, progress=progress, timer=timer, max_repeats=max_repeats,
                                 until=_pair_clear(best["step"], base["step"]) if max_repeats else None)
        self.final = {"final": ms[best["step"]], "baseline": ms[base["step"]]}
        if len(steps) == 3:
            self.final["start"] = ms[start["step"]]
        return self.final

    def labels(self) -> dict[str, str]:
        """How the headline names the final configuration and its baseline: step and batch."""
        base, best = self.device_baseline(), self.best()

        def name(r: Mapping[str, Any]) -> str:
            return f"{r['step']}, batch {r['batch_size']}" if r.get("batch_size") else r["step"]

        return {"final": f"the final configuration ({name(best)})", "baseline": f"the fp32 baseline on this device "
                f"({name(base)})", "start": f"the ladder's first step ({name(self.baseline())})"}

    def table(self):
        """All rows, with each ratio taken against the reference timed with it (the best configuration so far,
        re-measured interleaved with the step) and only when the decision rule gave one: ``speedup`` (NaN
        otherwise) and its text ``speedup_text`` (= ``vs_best_text``: "1.5x", "undecided", "unsteady",
        "reference" for the first step); ``flag`` ("undecided" / "unsteady" / ""), what the chart greys out; and
        ``why``: why a step does not apply, why it was re-tried, why no ratio is given."""
        import pandas as pd

        df = pd.DataFrame(self.rows)
        base = self.device_baseline()
        if base is None or "throughput" not in df:
            return df
        flags = [_flag(r) for r in self.rows]
        texts = [format_ratio(r["vs_best"]) if r.get("vs_best") is not None else f or
                 ("reference" if r.get("decision") == "baseline" else "") for r, f in zip(self.rows, flags)]
        df["vs_best_text"] = texts
        df["speedup"] = [r["vs_best"] if r.get("vs_best") is not None else float("nan") for r in self.rows]
        df["speedup_text"] = texts
        df["flag"] = flags
        df["why"] = ["; ".join(str(r[k]) for k in ("reason", "retry_why", "note")
                               if r.get(k) and not (k == "retry_why" and r.get("reason"))) for r in self.rows]
        df["baseline_step"] = base["step"]
        return df

    def summary(self) -> dict[str, Any]:
        """The configuration the ladder ends with (``final_config``, ``final_step``, ``final_batch_size``), whether
        every step on the way was decided (``final_status``: "decided", or "undecided" with ``undecided_steps``
        and ``final_status_sentence``: another run may end elsewhere), and its speed-up over the fp32 baseline of
        its own device (``final_speedup``, ``final_decision``, ``baseline_step``) from :meth:`final_comparison`
        (the two timed together). ``final_speedup`` is None unless that comparison is steady and decided
        (``final_sentence`` says why); 1.0 when the final configuration is that baseline and every step was
        decided against a steady baseline. With a first step on another device (a CPU baseline before a GPU
        ladder), ``start_step`` and ``final_vs_start`` (and its sentence) give that ratio, as context only."""
        base, best, start = self.device_baseline(), self.best(), self.baseline()
        if base is None:
            raise ValueError("the ladder has no measured step yet")
        tried = [r for r in self.rows if r["applicable"] and r is not start]
        open_steps = [r["step"] for r in tried if _flag(r)]
        out: dict[str, Any] = {"final_config": dict(self.current), "final_step": best["step"],
                               "final_batch_size": best.get("batch_size") or self.current.get("batch_size"),
                               "baseline_step": base["step"],
                               "steps_not_kept": [r["step"] for r in self.rows if r["applicable"] and not r["kept"]],
                               "retried": {r["retry_of"]: r["decision"] for r in self.rows if r.get("retry_of")},
                               "baseline_steady": unsteady_reason(base) is None,
                               "undecided_steps": open_steps, "final_status": "undecided" if open_steps else "decided",
                               "final_status_sentence": (
                                   f"The final configuration is undecided: {_listed(open_steps)} could not be decided "
                                   f"on this machine (undecided within the cap on repeats, or not steady), so another "
                                   f"run may end on another configuration." if open_steps else
                                   "Every step was decided, so the final configuration follows from the measurements.")}
        out.update(self._headline(base, best, open_steps, tried))
        if start is not base:
            a = self.final["final"] if self.final else best
            c = self.final["start"] if self.final and "start" in self.final else start
            d = decide(a, c)
            lab = self.labels()
            out.update(start_step=start["step"],
                       final_vs_start=d.ratio if d.outcome in ("faster", "slower", "same") else None,
                       final_vs_start_sentence=compare_sentence(a, c, a_label=lab["final"], b_label=lab["start"]))
        return out

    def _headline(self, base: Mapping[str, Any], best: Mapping[str, Any], open_steps: list[str],
                  tried: list[Mapping[str, Any]]) -> dict[str, Any]:
        """``final_speedup``, ``final_decision`` and ``final_sentence`` of :meth:`summary`."""
        if best is base:
            refused = unsteady_reason(base)
            if refused:
                return {"final_speedup": None, "final_decision": "unsteady", "final_sentence":
                        f"No ratio reported: {refused}; no step was kept over the baseline ({base['step']})."}
            if open_steps:
                return {"final_speedup": None, "final_decision": "undecided", "final_sentence":
                        f"No step was decided faster than the baseline ({base['step']}) on this machine, and "
                        f"{_listed(open_steps)} could not be decided: the final configuration stays the baseline and "
                        f"no speed-up is given."}
            if not tried:
                return {"final_speedup": None, "final_decision": "undecided",
                        "final_sentence": f"No step was measured against the baseline ({base['step']})."}
            return {"final_speedup": 1.0, "final_decision": "same", "final_sentence":
                    f"No step beat the baseline ({base['step']}) beyond the noise on this machine: the final "
                    f"configuration is the baseline."}
        if not self.final:
            return {"final_speedup": None, "final_decision": "undecided", "final_sentence":
                    "No speed-up reported: the final configuration and its baseline were not timed together "
                    "(Ladder.final_comparison)."}
        lab = self.labels()
        a, b = self.final["final"], self.final["baseline"]
        d = decide(a, b)
        return {"final_speedup": d.ratio if d.outcome in ("faster", "slower", "same") else None,
                "final_decision": d.outcome, "final_labels": {"final": lab["final"], "baseline": lab["baseline"]},
                "final_sentence": compare_sentence(a, b, a_label=lab["final"], b_label=lab["baseline"])}


def _flag(row: Mapping[str, Any]) -> str:
    """"undecided" / "unsteady" for a measured row whose decision gave no ratio (or a baseline that is not
    steady), else ""."""
    decision = str(row.get("decision") or "")
    return ("undecided" if decision.startswith("undecided") else
            "unsteady" if decision.startswith("not steady") or (decision == "baseline" and row.get("note")) else "")


def _listed(steps: list[str]) -> str:
    return ", ".join(steps[:-1]) + " and " + steps[-1] if len(steps) > 1 else steps[0]


def plot_ladder(df, *, label: str = "step", unit: str = "img/s", title: str = "Optimisation ladder",
                path: Any = None):
    """The ladder's chart, from :meth:`Ladder.table` (applicable rows): one bar per step, its median throughput with
    the noise band (interquartile range) as an error bar, labelled with the ratio its decision gave against the
    best configuration timed with it and the decision itself. Undecided and unsteady steps carry no ratio: their
    bars are grey and cross-hatched (legend); steps re-tried at the batch the sweep chose are hatched."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    rows = df.to_dict("records")
    values = [float(r["throughput"]) for r in rows]
    fig, ax = plt.subplots(figsize=(9, 0.6 * len(rows) + 1.4))
    colours = plt.cm.viridis([0.25 + 0.6 * i / max(1, len(rows) - 1) for i in range(len(rows))])
    bars = ax.barh(range(len(rows)), values, color=colours)
    handles = []
    for bar, r in zip(bars, rows):
        if r.get("flag"):
            bar.set_color("lightgrey")
            bar.set_hatch("xx")
            bar.set_edgecolor("grey")
        elif isinstance(r.get("retry_of"), str) and r["retry_of"]:
            bar.set_hatch("//")
            bar.set_edgecolor("white")
    if any(r.get("flag") for r in rows):
        handles.append(Patch(facecolor="lightgrey", hatch="xx", edgecolor="grey", label="undecided or unsteady: no ratio"))
    if any(isinstance(r.get("retry_of"), str) and r["retry_of"] and not r.get("flag") for r in rows):
        handles.append(Patch(facecolor="tab:blue", hatch="//", edgecolor="white", label="re-tried at the sweep's batch"))
    lows, highs = [float(r["throughput_low"]) for r in rows], [float(r["throughput_high"]) for r in rows]
    ax.errorbar(values, range(len(rows)), xerr=[[max(0.0, v - lo) for v, lo in zip(values, lows)],
                                                [max(0.0, hi - v) for v, hi in zip(values, highs)]],
                fmt="none", ecolor="black", elinewidth=1.2, capsize=4)
    handles.append(plt.Line2D([], [], color="black", marker="|", linestyle="-", label="noise band (interquartile range)"))
    ax.legend(handles=handles, loc="lower right", fontsize=8)
    ax.set_yticks(range(len(rows)), [str(r[label]) for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel(unit)
    ax.set_title(title)
    for bar, v, hi, r in zip(bars, values, highs, rows):
        ratio = r.get("speedup_text") or ""
        against = ratio if ratio in ("undecided", "unsteady", "reference", "") else f"{ratio} vs best so far"
        text = f"  {v:,.{0 if v >= 100 else 1}f} {unit}" + (f"  ({against})" if against else "") + f"  {r['decision']}"
        ax.text(max(v, hi), bar.get_y() + bar.get_height() / 2, text, va="center", fontsize=9)
    ax.set_xlim(0, max(max(values), max(highs)) * 1.8)
    ax.grid(axis="x", alpha=0.3)
    if path is not None:
        fig.savefig(path, dpi=120, bbox_inches="tight")
    return fig
