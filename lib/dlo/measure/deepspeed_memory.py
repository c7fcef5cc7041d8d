"""Our ZeRO memory calculator (:func:`dlo.measure.memory.per_gpu_memory`) beside DeepSpeed's own estimators:
what each counts, the difference term by term, and sentences that say which term makes it.

DeepSpeed is optional: it is imported inside :func:`deepspeed_estimate` only (its estimators are pure arithmetic and
compile nothing), and :func:`deepspeed_available` lets a notebook skip the comparison in one line without it.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from dlo.measure.memory import GB, count_parameters, parameter_count, per_gpu_memory
from dlo.runtime.validate import positive_int
from dlo.models.config import TransformerConfig

# ==================================================================================================
# Against DeepSpeed's own estimators
# ==================================================================================================

#: The ZeRO stages DeepSpeed ships a model-state estimator for (none for ZeRO-1).
DEEPSPEED_STAGES = (2, 3)
#: Bytes per parameter on each GPU's share that DeepSpeed's estimators count (ZeRO-2 and ZeRO-3 alike),
#: and the bytes per parameter of the largest module they add for ZeRO-3's gathered layer.
_DS_SHARE_BYTES, _DS_LAYER_BYTES = 18, 4


def largest_module_params(cfg: TransformerConfig) -> int:
    """What DeepSpeed's ZeRO-3 estimator calls the "largest layer": the most parameters held *directly* by one
    module (``m.parameters(recurse=False)``, as ``deepspeed.runtime.zero.stage3.model_to_params`` counts them):
    one embedding table, one linear projection, one norm or the output head, not a whole decoder layer (a
    tied head is the embedding's tensor, the same size)."""
    c = count_parameters(cfg)
    h, i = cfg.hidden_size, cfg.intermediate_size
    mb = 1 if cfg.mlp_bias else 0
    mlp_in, mlp_out = h * i + mb * i, i * h + mb * h  # gate/up (or fc1), down (or fc2)
    return max(c["embeddings"], c["lm_head"], c["attention_q"], c["attention_k"], c["attention_v"],
               c["attention_o"], mlp_in, mlp_out, c["final_norm"])


def _stage_checked(stage: int) -> int:
    if isinstance(stage, bool) or stage not in DEEPSPEED_STAGES:
        raise ValueError(f"DeepSpeed ships model-state estimators for ZeRO stages 2 and 3 only, not {stage!r}")
    return stage


def deepspeed_available() -> bool:
    """Whether ``deepspeed`` can be imported here (looked up without importing it)."""
    import importlib.util

    return importlib.util.find_spec("deepspeed") is not None


def deepspeed_estimate(model: TransformerConfig | int, n_gpus: int = 1, *, stage: int) -> int:
    """DeepSpeed's own per-GPU estimate, in bytes, of the model states of ZeRO ``stage`` 2 or 3 on ``n_gpus``
    GPUs of one node, without offload, computed by DeepSpeed's functions: the numbers that
    ``estimate_zero2_model_states_mem_needs_all_cold`` and ``estimate_zero3_model_states_mem_needs_all_cold``
    print in their ``offload_optimizer=none`` row (in GiB there; bytes here).

    DeepSpeed is an optional dependency imported here only; the estimators are plain arithmetic (importing
    them compiles none of DeepSpeed's C++/CUDA ops). Raises ``ModuleNotFoundError`` when it is not installed
    (:func:`deepspeed_available` tells beforehand). ZeRO-3 needs the architecture (a TransformerConfig), for
    the largest layer (:func:`largest_module_params`)."""
    _stage_checked(stage)
    positive_int("n_gpus", n_gpus)
    n = parameter_count(model)
    if stage == 2:
        from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

        _, gpu = estimate_zero2_model_states_mem_needs(total_params=n, num_gpus_per_node=n_gpus, num_nodes=1,
                                                       cpu_offload=False)
        return int(gpu)
    if not isinstance(model, TransformerConfig):
        raise ValueError("ZeRO-3's estimate needs the largest layer: pass a TransformerConfig")
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

    _, gpu, _ = estimate_zero3_model_states_mem_needs(total_params=n, largest_layer_params=largest_module_params(model),
                                                      num_gpus_per_node=n_gpus, num_nodes=1, cpu_offload=False,
                                                      cpu_offload_params=False, zero_init=True)
    return int(gpu)


def deepspeed_comparison(model: TransformerConfig, n_gpus: int = 1, *, stage: int,
                         deepspeed: int | None = None) -> dict[str, Any]:
    """This calculator next to DeepSpeed's estimator for ZeRO ``stage`` on ``n_gpus`` GPUs (AdamW, 16-bit
    mixed precision, model states only), term by term, so that the difference is explained, not just seen.

    What each counts, per GPU (``N`` parameters, ``g`` GPUs):

    ==================  =============================================  ===============================================
    term                :func:`per_gpu_memory`                         DeepSpeed's estimator
    ==================  =============================================  ===============================================
    replicated          ZeRO-2: 16-bit weights ``2N``                  ZeRO-2: 16-bit weights ``2N``
    sharded, per param  ZeRO-2: 14 (16-bit grad 2, fp32 master 4,     18 for both stages; its ZeRO-2 source reads them
                        Adam moments 8); ZeRO-3: 16 (+ 16-bit weight)  as 16-bit grad 2 + **fp32 grad 4** + fp32
                                                                       master 4 + moments 8
    gathered            ZeRO-3: 6 bytes x the largest FSDP unit (a     ZeRO-3: 4 bytes x the largest single module
                        decoder layer or the embedding): 2 units of    (:func:`largest_module_params`): its 16-bit
                        16-bit weights (computing + prefetched), 1 of  weights and gradients
                        16-bit gradients
    ==================  =============================================  ===============================================

    The fp32 gradient is real: at the optimizer step DeepSpeed's ZeRO-1/2 optimizer casts the rank's 16-bit
    gradient partition to fp32 and attaches it as the ``.grad`` of the fp32 master partition
    (``single_partition_of_fp32_groups[i].grad`` in ``stage_1_and_2.py``); this calculator leaves it out. Neither
    counts activations, communication buckets, the CUDA context or fragmentation; DeepSpeed's
    ``additional_buffer_factor`` (1.5) multiplies only its CPU figure.

    ``deepspeed``: DeepSpeed's number when already known (default: :func:`deepspeed_estimate`, which imports
    DeepSpeed). Returns the terms and ``explained`` = ours + the differences, which equals DeepSpeed's number
    (to the byte, up to rounding each share up or down), and ``ratio`` = ours / DeepSpeed's."""
    _stage_checked(stage)
    if not isinstance(model, TransformerConfig):
        raise TypeError(f"give a TransformerConfig (the ZeRO-3 terms need the architecture), got {model!r}")
    ours = per_gpu_memory(model, n_gpus, strategy=f"zero{stage}", optimizer="adamw", precision="bf16_mixed")
    n = count_parameters(model)["total"]
    sharded = ("gradients", "master_weights", "optimizer_states") + (("weights",) if stage == 3 else ())
    ours_share = sum(ours[k] for k in sharded)
    share_bytes = {2: 14, 3: 16}[stage]  # per parameter, on each GPU's share (see the table above)
    ds_share = _DS_SHARE_BYTES * n / n_gpus
    ds_gathered = _DS_LAYER_BYTES * largest_module_params(model) if stage == 3 else 0
    if deepspeed is None:
        deepspeed = deepspeed_estimate(model, n_gpus, stage=stage)
    extra_share = ds_share - share_bytes * n / n_gpus  # ZeRO-2: the fp32 gradient partition
    gathered_diff = ds_gathered - ours["gathered"]
    return {
        "model": model.name, "stage": stage, "n_gpus": n_gpus, "n_params": n,
        "ours": ours["total"], "deepspeed": int(deepspeed), "ratio": ours["total"] / deepspeed,
        "ours_share_bytes_per_param": share_bytes, "deepspeed_share_bytes_per_param": _DS_SHARE_BYTES,
        "ours_share": ours_share, "deepspeed_share": int(ds_share),
        "ours_gathered": ours["gathered"], "deepspeed_gathered": ds_gathered,
        "largest_module_params": largest_module_params(model),
        "extra_share": extra_share, "gathered_difference": gathered_diff,
        "explained": ours["total"] + extra_share + gathered_diff,
    }


def deepspeed_sentences(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """One sentence per (model, stage) of :func:`deepspeed_comparison` rows, written from their numbers: the
    range of ours / DeepSpeed's over the GPU counts, and at both ends which term makes most of the difference
    (the per-parameter share or the gathered layer)."""
    groups: dict[tuple[str, int], list[Mapping[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["model"], r["stage"]), []).append(r)

    def why(r: Mapping[str, Any]) -> str:
        if r["deepspeed"] == r["ours"]:
            return "the two agree"
        if abs(r["extra_share"]) >= abs(r["gathered_difference"]):
            return (f"mostly DeepSpeed's larger share, {r['deepspeed_share_bytes_per_param']} bytes per parameter "
                    f"against our {r['ours_share_bytes_per_param']}, {r['extra_share'] / GB:+.2f} GB")
        return (f"mostly the gathered layer, ours {r['ours_gathered'] / GB:.2f} GB against DeepSpeed's "
                f"{r['deepspeed_gathered'] / GB:.2f} GB")

    out = []
    for (model, stage), group in groups.items():
        lo = min(group, key=lambda r: r["ratio"])
        hi = max(group, key=lambda r: r["ratio"])
        gpus = lambda r: f"{r['n_gpus']} GPU{'s' if r['n_gpus'] > 1 else ''}"  # noqa: E731
        if lo is hi:
            out.append(f"{model}, ZeRO-{stage}: ours is {lo['ratio']:.2f}x DeepSpeed's on {gpus(lo)} ({why(lo)}).")
        else:
            out.append(f"{model}, ZeRO-{stage}: ours is {lo['ratio']:.2f}x DeepSpeed's on {gpus(lo)} ({why(lo)}) "
                       f"and {hi['ratio']:.2f}x on {gpus(hi)} ({why(hi)}).")
    return out
