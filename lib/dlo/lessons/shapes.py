"""Jour 1's shapes notebook, the plumbing behind its cells: the cited and measured rooflines and their plot, the
efficiency of each measured matmul against its bound (a value above a physical bound is said to be noise), and the
layer comparisons (aligned vs off-by-one sizes, a padded size, the padded stem), each timed interleaved; the
notebook states each with the decision rule (:func:`dlo.measure.conclude`)."""
from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import torch
from torch import nn

from dlo.measure import Measurement, Warmup, measure_interleaved, unsteady_reason
from dlo.measure import roofline as rl

#: The most warm-up seconds each layer gets before its timed rounds (an unsettled warm-up gives no verdict).
WARMUP_S = 15.0


def cited_roofline(dev: torch.device, precision: str) -> dict[str, Any]:
    """The datasheet roofline of this GPU, or of an H100 SXM (for scale) on a CPU or an unlisted GPU."""
    cited = rl.device_reference(dev, precision) if dev.type == "cuda" else None
    if cited is None:
        peak, bw = rl.spec_roofline("H100", "bf16")
        cited = {"name": "H100 SXM", "precision": "bf16", "peak_flops": peak, "bandwidth": bw,
                 "knee": rl.knee(peak, bw)}
    return cited


def _band(value: float, low: float, high: float, spread: float, unit: str, fmt: str = ".3g") -> str:
    steady = "" if spread <= 0.25 else f", unsteady: repeats spread {spread:.0%}"
    return f"{value:{fmt}} {unit} (noise band {low:{fmt}}-{high:{fmt}}{steady})"


def roofline_line(bw: dict[str, Any], roof: dict[str, Any], sweep: list[dict[str, Any]], precision: str) -> str:
    """The measured bandwidth, best matmul and knee, each with its noise band (interquartile range of the calls)."""
    best = max(sweep, key=lambda r: r["tflops"])
    return (f"copy bandwidth: {_band(bw['gb_s'], bw['gb_s_low'], bw['gb_s_high'], bw['spread'], 'GB/s')}\n"
            f"best {precision} matmul (n = {best['n']}): "
            f"{_band(best['tflops'], best['tflops_low'], best['tflops_high'], best['spread'], 'TFLOP/s')}\n"
            f"knee from these medians: {roof['knee']:.1f} FLOP/B")


def plot_measured_roofline(sweep: list[dict[str, Any]], roof: dict[str, Any], cited: dict[str, Any], precision: str,
                           path: Any = None) -> plt.Figure:
    """The measured matmuls (with their noise bands) against the measured roofs, and the cited roofline."""
    def roof_line(ax, peak, bandwidth, text, style, color):
        x = np.logspace(-1, 4, 200)
        ax.plot(x, np.array(rl.attainable(list(x), peak, bandwidth)) / 1e12, style, color=color, label=text)

    fig, ax = plt.subplots(figsize=(8, 4.5))
    roof_line(ax, roof["peak_flops"], roof["bandwidth"], f"this machine (measured), knee {roof['knee']:.0f} FLOP/B",
              "-", "tab:blue")
    ys = np.array([r["tflops"] for r in sweep])
    err = [ys - [r["tflops_low"] for r in sweep], [r["tflops_high"] for r in sweep] - ys]
    ax.errorbar([r["intensity"] for r in sweep], ys, yerr=err, fmt="o", color="tab:blue", zorder=3,
                label=f"measured {precision} matmuls (n = {sweep[0]['n']} ... {sweep[-1]['n']}), noise bands")
    for r in sweep[:: max(1, len(sweep) // 5)]:
        ax.annotate(f"n={r['n']}", (r["intensity"], r["tflops"]), fontsize=7, xytext=(3, -10), textcoords="offset points")
    roof_line(ax, cited["peak_flops"], cited["bandwidth"],
              f"{cited['name']} {cited['precision']} (cited datasheet), knee {cited['knee']:.0f} FLOP/B", "--", "tab:gray")
    ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP / byte)", ylabel="TFLOP/s",
           title="Roofline: measured matmuls against the measured roofs")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig


def efficiency(record: dict[str, Any], roof: dict[str, Any]) -> tuple[float, float, float]:
    """A matmul's measured FLOP/s as a fraction of its roofline bound: (median, low, high) from its noise band."""
    bound = rl.attainable(record["intensity"], roof["peak_flops"], roof["bandwidth"]) / 1e12
    return record["tflops"] / bound, record["tflops_low"] / bound, record["tflops_high"] / bound


def _efficiency_phrase(record: dict[str, Any], roof: dict[str, Any]) -> str:
    eff, low, high = efficiency(record, roof)
    n = record["n"]
    if record["spread"] > 0.25:
        return f"n = {n} was not measured steadily (its repeats spread {record['spread']:.0%}): no efficiency is given"
    if low > 1.0:
        return (f"n = {n} measures {low:.0%}-{high:.0%} of its bound, above a physical bound: noise (the copy that "
                f"sets the memory roof and this matmul ran at different moments of a busy machine, or this matmul "
                f"ran from the caches), not a fact")
    if high > 1.0:
        return f"n = {n} reaches its bound within the noise ({low:.0%}-{high:.0%})"
    return f"n = {n} reaches {eff:.0%} of its bound (noise band {low:.0%}-{high:.0%})"


def efficiency_sentence(sweep: list[dict[str, Any]], roof: dict[str, Any], cited: dict[str, Any],
                        dev: torch.device) -> str:
    """Where the knee is, how many sizes are left of it, and how close the smallest and largest come to their
    bounds (with their noise bands; above 100 % said to be noise)."""
    below = [r for r in sweep if r["intensity"] < roof["knee"]]
    return (f"On this {dev.type.upper()} the knee is at **{roof['knee']:.1f} FLOP/B** (measured): {len(below)} of the "
            f"{len(sweep)} matmul sizes are left of it. The smallest matmul: {_efficiency_phrase(sweep[0], roof)}; "
            f"the largest: {_efficiency_phrase(sweep[-1], roof)}. Small matmuls fall *below* the roof: fixed costs (a "
            f"call, a kernel launch, threads to wake) weigh more than the data moved. On the cited {cited['name']} the "
            f"knee is at {cited['knee']:.0f} FLOP/B: a square bf16 matmul needs n >= "
            f"{rl.knee_matmul_size(cited['peak_flops'], cited['bandwidth'], torch.bfloat16)} to get there.")


def _prepare(module: nn.Module, x: torch.Tensor, dev: torch.device, dtype: torch.dtype):
    module, x = module.to(dev, dtype=dtype), x.to(dev, dtype=dtype)
    if x.ndim == 4:
        module, x = module.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)
    return module, x


def compare_layers(results: dict[str, Any], a: tuple[str, nn.Module, torch.Tensor],
                   b: tuple[str, nn.Module, torch.Tensor], *, dev: torch.device, dtype: torch.dtype, repeats: int,
                   key: str) -> tuple[Measurement, Measurement]:
    """Time the forward passes of two layers interleaved (``(name, module, input)`` each), record both under
    ``results[key]`` and return their measurements (a, b), for :func:`dlo.measure.conclude`."""
    calls = {}
    for name, module, x in (a, b):
        module, x = _prepare(module, x, dev, dtype)
        calls[name] = (lambda m=module, t=x: m(t))
    with torch.inference_mode():
        ms = measure_interleaved(calls, items_per_call=len(a[2]), device=dev, repeats=repeats,
                                 max_repeats=2 * repeats, warmup=Warmup(max_seconds=WARMUP_S), track_memory=False)
    ma, mb = ms[a[0]], ms[b[0]]
    results.setdefault(key, []).extend([ma.to_record(), mb.to_record()])
    return ma, mb


def alignment(results: dict[str, Any], linear: dict[str, int], conv: dict[str, int], *, dev: torch.device,
              dtype: torch.dtype, repeats: int) -> list[tuple[Measurement, Measurement, float]]:
    """Aligned against off-by-one `Linear` and `Conv2d` (channels_last), each pair timed interleaved:
    ``[(aligned, off_by_one, extra FLOPs as a fraction), ...]``."""
    torch.manual_seed(0)
    n, c, out = linear["n"], conv["c"], []
    x = torch.randn(linear["batch"], n + 1)
    pair = ((f"Linear({n}, {n})", nn.Linear(n, n), x[:, :n].contiguous()),
            (f"Linear({n + 1}, {n + 1})", nn.Linear(n + 1, n + 1), x))
    out.append((*compare_layers(results, *pair, dev=dev, dtype=dtype, repeats=repeats, key="alignment"),
                ((n + 1) / n) ** 2 - 1))
    img = torch.randn(conv["batch"], c + 1, conv["hw"], conv["hw"])
    pair = ((f"Conv2d({c}, {c}, 3)", nn.Conv2d(c, c, 3, padding=1, bias=False), img[:, :c].contiguous()),
            (f"Conv2d({c + 1}, {c + 1}, 3)", nn.Conv2d(c + 1, c + 1, 3, padding=1, bias=False), img))
    out.append((*compare_layers(results, *pair, dev=dev, dtype=dtype, repeats=repeats, key="alignment"),
                ((c + 1) / c) ** 2 - 1))
    return out


def stem_padding(results: dict[str, Any], stem: dict[str, int], *, dev: torch.device, dtype: torch.dtype,
                 repeats: int) -> tuple[Measurement, Measurement]:
    """The first convolution on the image padded to 4 channels (a zero channel, zero weights: the same output,
    checked) and on the 3-channel image, timed interleaved: (padded, three_channels)."""
    torch.manual_seed(0)
    conv3 = nn.Conv2d(3, stem["c_out"], 3, padding=1, bias=False)
    conv4 = nn.Conv2d(4, stem["c_out"], 3, padding=1, bias=False)
    with torch.no_grad():
        conv4.weight.zero_()
        conv4.weight[:, :3] = conv3.weight
    x3 = torch.randn(stem["batch"], 3, stem["hw"], stem["hw"])
    x4 = rl.pad_channels(x3, 4)
    with torch.no_grad():
        assert torch.allclose(conv4(x4), conv3(x3), atol=1e-5), "a zero channel with zero weights must not change the output"
    return compare_layers(results, ("stem conv, padded to 4 channels", conv4, x4), ("stem conv, 3 channels", conv3, x3),
                          dev=dev, dtype=dtype, repeats=repeats, key="stem_padding")


def unsteady(records: list[dict[str, Any]]) -> list[str]:
    """The reasons, if any, why some of ``records`` (Measurement records) give no ratio."""
    return [r for r in (unsteady_reason(x) for x in records) if r]
