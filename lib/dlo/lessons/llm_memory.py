"""The questions of ``Jour4/llm_memory.ipynb`` answered by the memory calculator, next to the student's predictions.

The student writes an answer down first (``my_answers``, a dict keyed like :data:`PREDICTED`); then
:func:`course_answers` computes the calculator's answers and :func:`against_predictions` puts both side by side.
"""
from __future__ import annotations

from typing import Any, Mapping

import pandas as pd

from dlo.measure import memory as M

#: The answers the student predicts before the calculator reveals them (keys of :func:`course_answers`).
PREDICTED = ("3B under DDP: GB on one GPU", "70B under FSDP with checkpointing: fewest GPUs")


def course_answers(small: M.TransformerConfig, large: M.TransformerConfig, gpu_memory_gb: float,
                   seq_len: int) -> dict[str, Any]:
    """What fits: ``small`` (Llama 3.2 3B) under DDP on one GPU of ``gpu_memory_gb`` (GB, total and largest batch,
    with and without activation checkpointing), and the fewest such GPUs for ``small`` and ``large`` (Llama 3.3
    70B) under FSDP, batch 1 of ``seq_len`` tokens, AdamW in bf16 mixed precision."""
    ddp1 = M.per_gpu_memory(small, 1, strategy="ddp", batch=1, seq_len=seq_len)
    fsdp_70b = M.min_gpus(large, gpu_memory_gb, strategy="fsdp", batch=1, seq_len=seq_len)
    return {
        PREDICTED[0]: ddp1["total"] / M.GB,
        "3B under DDP: fits?": ddp1["total"] <= gpu_memory_gb * M.GB,
        f"3B under DDP: largest batch of {seq_len} tokens": M.max_batch(small, gpu_memory_gb, seq_len=seq_len,
                                                                         strategy="ddp"),
        "3B under DDP with checkpointing: largest batch": M.max_batch(small, gpu_memory_gb, seq_len=seq_len,
                                                                       strategy="ddp", checkpointing=True),
        "3B under FSDP: fewest GPUs": M.min_gpus(small, gpu_memory_gb, strategy="fsdp", batch=1, seq_len=seq_len),
        "70B under FSDP: fewest GPUs": fsdp_70b if fsdp_70b else "none: activations alone do not fit",
        PREDICTED[1]: M.min_gpus(large, gpu_memory_gb, strategy="fsdp", batch=1, seq_len=seq_len,
                                 checkpointing=True),
    }


def _shown(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.1f}"
    return f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else str(v)


def against_predictions(answers: Mapping[str, Any], predicted: Mapping[str, Any]) -> pd.DataFrame:
    """One row per question: the calculator's answer and the student's prediction ("-" where none was written)."""
    unknown = sorted(set(predicted) - set(answers))
    if unknown:
        raise KeyError(f"no question named {unknown}: predict under the keys {list(PREDICTED)}")
    return pd.DataFrame({"calculator": [_shown(v) for v in answers.values()],
                         "your prediction": [_shown(predicted.get(k)) for k in answers]},
                        index=pd.Index(list(answers), name="question"))


__all__ = ["PREDICTED", "course_answers", "against_predictions"]
