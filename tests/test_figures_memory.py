"""The memory picture of llm_memory.ipynb: every segment drawn is the memory calculator's term for that strategy,
model and number of GPUs (two models, two sharding degrees), drawn to one scale, in the order of the bars."""
from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from dlo.lessons.figures.memory import TERMS, memory_per_gpu  # noqa: E402
from dlo.lessons.figures.style import drawn  # noqa: E402
from dlo.measure import memory as M  # noqa: E402
from dlo.models import config as presets  # noqa: E402

STRATEGIES = ("ddp", "zero1", "zero2", "fsdp")


@pytest.mark.parametrize("model", [presets.LLAMA_3_2_3B, presets.LLAMA_3_3_70B], ids=lambda m: m.name)
@pytest.mark.parametrize("n_gpus", [8, 64])
def test_the_drawn_segments_are_the_calculators_terms(model, n_gpus):
    fig = memory_per_gpu(model, n_gpus, strategies=STRATEGIES, batch=1, seq_len=4096, checkpointing=True)
    segments = [d for d in drawn(fig, "box") if d["tag"] and d["tag"][0] == "segment"]
    for strategy in STRATEGIES:
        want = M.per_gpu_memory(model, n_gpus, strategy=strategy, batch=1, seq_len=4096, checkpointing=True)
        mine = [s for s in segments if s["tag"][1] == strategy]
        assert [s["tag"][2] for s in mine] == [t for t in TERMS if want[t]], strategy  # stacked in TERMS' order
        assert {s["tag"][2]: s["tag"][3] for s in mine} == {t: want[t] for t in TERMS if want[t]}
        assert sum(s["tag"][3] for s in mine) == want["total"]
        for a, b in zip(mine, mine[1:]):  # one bar: each segment starts where the previous one ends
            assert math.isclose(a["x"] + a["w"], b["x"]) and a["y"] == b["y"]
    scale = {s["w"] / s["tag"][3] for s in segments}  # one scale: width proportional to bytes
    assert max(scale) == pytest.approx(min(scale), rel=1e-9)
    plt.close(fig)


def test_sharding_shrinks_each_bar_in_the_order_of_the_strategies():
    fig = memory_per_gpu(presets.LLAMA_3_2_3B, 8, strategies=STRATEGIES)
    widths = {}
    for s in drawn(fig, "box"):
        widths[s["tag"][1]] = widths.get(s["tag"][1], 0) + s["w"]
    assert widths["ddp"] > widths["zero1"] > widths["zero2"] > widths["fsdp"]
    labels = [d["text"] for d in drawn(fig, "label")]
    assert "one 80 GB GPU" in labels and "ZeRO-3 / FSDP" in labels
    plt.close(fig)
