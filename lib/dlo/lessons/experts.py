"""What tp_fsdp/experts.ipynb measures around its exercises: the capacity sweep (decisions dropped against the
capacity factor, :func:`capacity_sweep`, its plot :func:`capacity_plot` and the answer to the notebook's
question, :func:`capacity_answer`) and the all_to_all volume of expert parallelism, predicted from the routing
and counted in the calls (:func:`all_to_all_volume`, :func:`volume_lines`)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import matplotlib.pyplot as plt
import pandas as pd
import torch

from dlo.parallel import experts as X


def capacity_sweep(x: torch.Tensor, hidden: int, inter: int, experts: int, top_k: int,
                   factors: Sequence[float]) -> pd.DataFrame:
    """The same batch ``x`` through an MoE layer at each capacity factor: capacity, decisions dropped (count and %),
    tokens whose every choice was dropped, decisions kept per expert."""
    rows = []
    for cf in factors:
        layer = X.MoEFeedForward(hidden, inter, experts, top_k, capacity_factor=cf, seed=0)
        with torch.no_grad():
            layer(x)
        st = layer.stats
        rows.append({"capacity_factor": cf, "capacity": st["capacity"][0], "dropped decisions": st["dropped"],
                     "dropped %": 100 * st["dropped"] / (x.shape[0] * top_k),
                     "tokens dropped entirely": st["dropped_tokens"], "kept_per_expert": st["kept_per_expert"]})
    return pd.DataFrame(rows)


def capacity_plot(sweep: pd.DataFrame, routed: Sequence[int], tokens: int, experts: int, top_k: int,
                  path: str | Path | None = None) -> plt.Figure:
    """Decisions routed to each expert against the capacity at factors 1 and 1.25, and the share dropped
    against the capacity factor."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.4))
    ax1.bar(range(experts), routed, color="tab:gray", label="routed (decisions)")
    for cf, color in ((1.0, "tab:red"), (1.25, "tab:orange")):
        if cf in set(sweep["capacity_factor"]):
            ax1.axhline(X.capacity(tokens, experts, top_k, cf), color=color, ls="--", label=f"capacity, factor {cf}")
    ax1.set(xlabel="expert", ylabel="decisions", title=f"tokens per expert ({tokens} tokens, top-{top_k})")
    ax1.legend(fontsize=8)
    ax2.plot(sweep["capacity_factor"], sweep["dropped %"], marker="o", label="dropped decisions")
    ax2.plot(sweep["capacity_factor"], 100 * sweep["tokens dropped entirely"] / tokens, marker="s",
             label="tokens dropped entirely")
    ax2.set(xlabel="capacity factor", ylabel="% of the batch", title="dropped against the capacity factor")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


def capacity_answer(sweep: pd.DataFrame, imbalance: float) -> str:
    """The answer to "how much is dropped at factor 1, and which factor drops nothing?", from the sweep."""
    at_one = sweep[sweep["capacity_factor"] == 1.0]
    first = "" if at_one.empty else (f"At factor 1, {at_one['dropped %'].iloc[0]:.1f} % of the decisions were "
                                     f"dropped. ")
    none = sweep[sweep["dropped decisions"] == 0]
    rest = (f"The smallest factor of the sweep that dropped nothing is {none['capacity_factor'].min():g}"
            if len(none) else "Every factor of the sweep dropped some decisions")
    return f"**Answer.** {first}{rest}; the busiest expert's load over the mean load (the imbalance) was {imbalance:.2f}."


def all_to_all_volume(records: list[dict[str, Any]], hidden: int) -> pd.DataFrame:
    """Per capacity factor of the expert-parallel launch: the rows each rank sent to each rank in the dispatch,
    the bytes predicted from them (``X.all_to_all_bytes``) and the bytes the ranks counted in their calls."""
    compare = [r for r in records if r["case"] == "compare"]
    rows = []
    for cf in sorted({r["capacity_factor"] for r in compare}, key=lambda c: c or 0):
        ranks = sorted((r for r in compare if r["capacity_factor"] == cf), key=lambda r: r["rank"])
        sent = [r["calls"][1]["rows"] for r in ranks]  # the dispatch: rows from each rank to each rank
        element = torch.finfo(getattr(torch, ranks[0]["dtype"])).bits // 8
        predicted = X.all_to_all_bytes(sent, hidden, element)
        counted = {phase: sum(c["bytes_to_others"] for r in ranks for c in r["calls"]
                              if c["phase"] == phase and c["dtype"] != "int64") for phase in ("forward", "backward")}
        calls = {phase: sum(1 for c in ranks[0]["calls"] if c["phase"] == phase) for phase in ("forward", "backward")}
        rows.append({"capacity_factor": cf or "none", "rows sent (rank -> rank)": sent,
                     "dispatch predicted (B)": predicted, "step predicted (B)": 4 * predicted,
                     "forward counted (B)": counted["forward"], "backward counted (B)": counted["backward"],
                     "all_to_all calls fwd / bwd": (calls["forward"], calls["backward"]),
                     "matches": counted["forward"] == counted["backward"] == 2 * predicted})
    return pd.DataFrame(rows)


def volume_lines(volume: pd.DataFrame) -> str:
    """Markdown: the bytes that cross between ranks per step, per capacity factor, as counted."""
    return "\n".join(
        f"* capacity factor {row['capacity_factor']}: {row['step predicted (B)']:,} bytes of tokens cross between "
        f"ranks per step (4 × {row['dispatch predicted (B)']:,}), as counted; {row['all_to_all calls fwd / bwd'][0]} "
        f"all_to_all calls forward (counts + 2 token exchanges), {row['all_to_all calls fwd / bwd'][1]} backward"
        for _, row in volume.iterrows())
