"""Checkers of tp_fsdp/fsdp_train.py's two configuration steps (``dlo check fsdp offload`` and ``deepspeed``): the
student's function against the reference on generated cases.

- ``offload``: every device a run may be given (``cuda:0``, ``cuda:1``, ``cuda`` without an index, ``cpu``),
  enabled or not, each on a machine with GPUs and on one without (``torch.cuda.is_available`` patched): the policy's
  type and pinning, or the ValueError where offloading cannot apply;
- ``deepspeed``: ZeRO stages 1, 2, 3 with world sizes 1 to 8 and global batches they divide (fixed cases and drawn
  ones), fp32 and bf16: every field the reference sets; stages that do not exist and batches the world size does not
  divide must raise ValueError.

These steps build configurations only: nothing runs DeepSpeed itself, so they are checked whether it is installed
or not.
"""
from __future__ import annotations

from typing import Any, Callable
from unittest import mock

import torch

from dlo.course.checks.cases import Case, compare, seeded
from dlo.course.checks.framework import CheckFailed, expect, register

SCRIPT = "tp_fsdp/fsdp_train.py"


def _offload_reference(device: torch.device, enabled: bool) -> Any:
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

    if not enabled:
        return OffloadPolicy()
    if torch.device(device).type != "cuda":
        raise ValueError("nothing to offload on the CPU")
    return CPUOffloadPolicy(pin_memory=True)


def _describe(policy: Any) -> str:
    pin = getattr(policy, "pin_memory", None)
    return f"{type(policy).__name__}" + (f"(pin_memory={pin})" if pin is not None else "") if policy is not None \
        else "None"


def _offload_outcome(fn: Callable, device: torch.device, enabled: bool, gpus: bool) -> str:
    """What ``fn`` gives, in words comparable between the answer and the reference."""
    with mock.patch("torch.cuda.is_available", return_value=gpus):
        try:
            got = fn(device, enabled)
        except ValueError:
            return "ValueError"
        except NotImplementedError:
            raise
        except Exception as exc:  # noqa: BLE001 - any other error of the answer is reported
            return f"{type(exc).__name__}"
    return "the class itself, not an instance" if isinstance(got, type) else _describe(got)


@register("fsdp", "offload", ("offload_policy",), SCRIPT)
def _check_offload(offload_policy: Callable) -> str:
    devices = [torch.device("cuda", 0), torch.device("cuda", 1), torch.device("cuda"), torch.device("cpu")]
    tried = 0
    for enabled in (False, True):
        for device in devices:
            for gpus in (True, False):
                got = _offload_outcome(offload_policy, device, enabled, gpus)
                want = _offload_outcome(_offload_reference, device, enabled, gpus)
                tried += 1
                if got == want:
                    continue
                case = (f"offload_policy({device}, {enabled}) on a machine {'with' if gpus else 'without'} GPUs: it "
                        f"gave {got}, expected {want}")
                if not enabled:
                    raise CheckFailed(f"{case}: not enabled, return the base OffloadPolicy, which offloads nothing")
                if want == "ValueError":
                    raise CheckFailed(f"{case}: offload asked while training on {device.type} must raise ValueError "
                                      "(nothing to offload), whatever the machine has: the device argument decides")
                if got == "ValueError":
                    raise CheckFailed(f"{case}: enabled on a GPU ({device}), offloading applies: decide from the "
                                      "device argument (its type), not from this machine or the device's index")
                if "pin_memory=False" in got:
                    raise CheckFailed(f"{case}: pin_memory=True, page-locked CPU memory copies to and from the GPU "
                                      "faster")
                raise CheckFailed(f"{case}: enabled on a GPU, return a CPUOffloadPolicy instance")
    return f"sharded state in CPU memory on GPUs; a clear error where it cannot apply ({tried} cases)"


def _deepspeed_reference(stage: int, global_batch: int, world_size: int, precision: str = "fp32") -> dict:
    if stage not in (1, 2, 3):
        raise ValueError(f"no ZeRO stage {stage!r}")
    if global_batch % world_size or global_batch < world_size:
        raise ValueError(f"{world_size} ranks cannot share {global_batch} sequences")
    return {"train_batch_size": global_batch, "train_micro_batch_size_per_gpu": global_batch // world_size,
            "gradient_accumulation_steps": 1, "zero_optimization": {"stage": stage},
            "bf16": {"enabled": precision == "bf16"}}


def _ds_case(stage: int, batch: int, world: int, precision: str) -> Case:
    return Case(f"deepspeed_config({stage}, {batch}, {world}, {precision!r})",
                {"stage": stage, "global_batch": batch, "world_size": world, "precision": precision},
                size=batch + world / 10)


def _deepspeed_cases() -> tuple[list[Case], list[Case]]:
    """(valid cases: fixed and drawn; cases that must raise ValueError)."""
    fixed = [_ds_case(1, 8, 2, "fp32"), _ds_case(2, 6, 3, "bf16"), _ds_case(3, 5, 1, "fp32"),
             _ds_case(3, 12, 4, "bf16"), _ds_case(2, 7, 7, "fp32"), _ds_case(1, 16, 8, "bf16")]
    valid = seeded(lambda r: (lambda w: _ds_case(r.randint(1, 3), w * r.randint(1, 4), w, r.choice(["fp32", "bf16"])))(
        r.randint(1, 8)), 6, seed=3, fixed=fixed)
    invalid = [_ds_case(s, b, w, "fp32") for s, b, w in ((4, 8, 2), (0, 8, 2), (1, 5, 2), (3, 10, 4), (2, 9, 6),
                                                        (3, 3, 4))]
    return valid, invalid


def _field_problem(case: Case, got: Any, want: dict) -> str | None:
    if not isinstance(got, dict):
        return f"with {case.label}: it returned {type(got).__name__}, expected a dict"
    for key, value in want.items():
        if key not in got:
            return f"with {case.label}: the config has no {key!r} (expected {value!r})"
        if key == "bf16" and not isinstance(got[key], dict):
            return (f"with {case.label}: 'bf16' must be a section with an 'enabled' key, got {got[key]!r} (DeepSpeed "
                    "ignores a bare value there)")
        problem = compare(got[key], value, key)
        if problem:
            rule = {"train_micro_batch_size_per_gpu": " (per rank: global batch / world size)",
                    "train_batch_size": " (the global batch)",
                    "bf16": ": the bf16 section must be enabled only for bf16"}.get(key, "")
            return f"with {case.label}: {problem}{rule}"
    return None


@register("fsdp", "deepspeed", ("deepspeed_config",), SCRIPT)
def _check_deepspeed(deepspeed_config: Callable) -> str:
    valid, invalid = _deepspeed_cases()
    for case in valid:
        try:
            got = deepspeed_config(**case.kwargs)
        except ValueError as exc:
            raise CheckFailed(f"with {case.label}: it raised ValueError ({str(exc)[:80]}), expected a config") from None
        problem = _field_problem(case, got, _deepspeed_reference(**case.kwargs))
        expect(not problem, problem or "")
    for case in invalid:
        try:
            got = deepspeed_config(**case.kwargs)
        except ValueError:
            continue
        stage, batch, world = case.kwargs["stage"], case.kwargs["global_batch"], case.kwargs["world_size"]
        why = (f"ZeRO has no stage {stage} (1, 2 or 3)" if stage not in (1, 2, 3) else
               f"the world size must divide the global batch ({batch} sequences over {world} ranks)")
        shown = got.get("train_micro_batch_size_per_gpu") if isinstance(got, dict) else got
        raise CheckFailed(f"{case.label} must raise ValueError: {why}; it returned a config "
                          f"(train_micro_batch_size_per_gpu={shown!r})")
    return (f"ZeRO stage, global and per-rank batch in one JSON config ({len(valid)} configs, {len(invalid)} "
            "refused)")
